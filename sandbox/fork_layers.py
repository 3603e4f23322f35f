"""A fork's lower stack, with its donors' layers, and the holding of the capsules it stacks on.

``CapsuleManager.fork`` (manager.py) stacks a child on its parent's layers, and with
``donors`` on other capsules' layers too: a merge's other inputs, whose changes then
need no write (mcp_server/capsules/merge.py writes into the child only what more than
one input changed).  Why stacking another capsule's upper is sound is overlay.py's essay.

* **What a donor adds.**  The parent's stack is ``[parent upper, *parent lowers]`` and a
  donor's ``[donor upper, *donor lowers]``; the donor adds its stack less the longest
  tail the two share.  A fork of the parent or of one of its ancestors adds only its own
  layers above the shared chain; an ancestor of the parent adds nothing.
* **Refused** with UNSUPPORTED (nothing made, nothing frozen), so that the front end
  writes the files instead: a donor whose shared tail does not hold the whole base (it
  is over another workspace or base), and a layer that would be in the stack twice
  (two donors sharing one, or a donor holding a layer the parent's stack has above the
  shared tail): overlayfs refuses a stack that names a layer twice.  A stack deeper than
  ``MAX_FORK_DEPTH`` capsule layers above the base is TOO_LARGE.
* **Held** as the parent is: each capsule stacked on must be idle and freezable, and is
  frozen (capsule_mounts.set_frozen) while the child lives; it keeps the child among its
  ``children``, so its execs, writes and destruction are refused until the child is gone.
"""

from __future__ import annotations

from collections.abc import Sequence

from sandbox import capsule_mounts, services
from sandbox.errors import CcwError
from sandbox.meta import Capsule

MAX_FORK_DEPTH = 64  # overlay allows 500 lowers; deeper what-if chains are a bug


def stacked(parent: Capsule, donors: Sequence[Capsule]) -> tuple[list[str], int]:
    """The child's lowers, top first (each donor's own layers, in the order given, above the
    parent's stack), and how many of them are capsules' uppers above the base."""
    own = [parent.path("upper"), *parent.lowers]
    held = {layer: parent.capsule_id for layer in own}
    added: list[str] = []
    for donor in donors:
        theirs = [donor.path("upper"), *donor.lowers]
        shared = 0
        while shared < min(len(own), len(theirs)) and own[-1 - shared] == theirs[-1 - shared]:
            shared += 1
        if shared < max(len(parent.base_lowers), len(donor.base_lowers)):
            raise CcwError("UNSUPPORTED", f"capsule {donor.capsule_id} cannot be stacked on {parent.capsule_id}: "
                           f"it is over another base ({donor.base_lowers[0]}, not {parent.base_lowers[0]}); "
                           "merge capsules of one workspace", {"capsule_id": donor.capsule_id})
        for layer in theirs[: len(theirs) - shared]:
            if layer in held:
                raise CcwError("UNSUPPORTED", f"capsule {donor.capsule_id} cannot be stacked on {parent.capsule_id}: "
                               f"its layer {layer} is stacked already (through {held[layer]}), and overlayfs "
                               "refuses a layer twice", {"capsule_id": donor.capsule_id, "layer": layer})
            held[layer] = donor.capsule_id
            added.append(layer)
    above = len(added) + 1 + parent.layers_above_base
    if above >= MAX_FORK_DEPTH:
        raise CcwError("TOO_LARGE", f"forks nest at most {MAX_FORK_DEPTH} layers deep (this one would stack {above}); "
                       "fork an earlier capsule or stack fewer donors")
    return [*added, *own], above


def hold(capsules: Sequence[Capsule]) -> None:
    """Each capsule a child is being stacked on (its parent first), kept frozen while it is
    built (a reserved ``children`` entry, ""); none is held if one cannot be.  Call with the
    manager's lock held, each capsule's last exec ended (jail_end.after_ending), each mounted."""
    for index, capsule in enumerate(capsules):
        doing, retry = ("forked", "fork it") if index == 0 else ("stacked into a fork", "stack it")
        if capsule.busy:
            raise CcwError("CONFLICT", f"capsule {capsule.capsule_id} is running a command; {retry} when that ends",
                           {"capsule_id": capsule.capsule_id})
        if not capsule.children:  # a service writing through its open files would change the fork's lower layer
            services.check_freezable(capsule, doing, "stop its services first (capsule_service_stop)")
    for index, capsule in enumerate(capsules):
        first = not capsule.children
        capsule.children.add("")
        if first:
            try:
                capsule_mounts.set_frozen(capsule, True)
            except BaseException:
                capsule.children.discard("")
                services.apply(capsule)
                release(capsules[:index], None)
                raise


def release(capsules: Sequence[Capsule], child: str | None) -> None:
    """Drop the reservations ``hold`` made: ``child`` (the child made, or None) kept among each
    capsule's children instead; a capsule left without children thaws.  The manager's lock held."""
    for capsule in capsules:
        capsule.children.discard("")
        if child is not None:
            capsule.children.add(child)
        elif not capsule.children:
            capsule_mounts.set_frozen(capsule, False)
