"""The jail launcher's binary interface: one table, read by the helper and compiled into ``ccw-jail``.

The helper (jail_launcher.py, contain.py) and the launcher (sandbox/jail/, C) agree on
descriptor numbers, option bits, mount step codes, the plan's bounds and its magic.
They were once written in both languages and matched by position; now this module is
the only place they are written.  The build (setup.py ``build_program``) runs
``header()`` into a generated ``jail_interface.h`` that sandbox/jail/jail.h includes,
so the C names the values and never spells them, and the helper imports the same
dictionaries.  Why generate the C rather than parse it from Python: the table is data
either way, but a Python parser of C would have to be as strict as the compiler about
what it accepts, while a generator's output is checked by the compiler itself; and a
fresh machine's build already runs Python (setup.py), so the generator costs nothing.

A launcher built from another table (a checkout whose ``ccw-jail`` was not rebuilt
after this file changed) must not read a plan with shifted bits: the plan's magic ends
in four bytes of a digest of the table (``MAGIC``), the launcher compares them with its
own and refuses any other plan ("rebuild the launcher").

This module imports nothing of ccw, so setup.py can load it by path, before ccw is
installed.  ``python sandbox/jail_interface.py`` prints the header.
"""

from __future__ import annotations

import hashlib
import json
import sys

# The descriptors ccw-jail is spawned with (0-2: the command's stdio).
DESCRIPTORS = {
    "REPORT": 3,   # the report pipe (supervise.py reads it)
    "PLAN": 4,     # the plan, a memfd read to its end
    "NET": 5,      # a network namespace to join (PLAN_NET)
    "ROOT": 6,     # the root tree, built ahead (PLAN_ROOT)
    "LAUNCH": 7,   # the mount namespace to copy (PLAN_LAUNCH)
    "CGROUPS": 8,  # and up: the tasks files, then the binds' sources, then the notifying filter's socket
}
# The option bits of the 'O' record.
OPTIONS = {
    "DIRECT": 1,             # already pid 1 of the jail's pid namespace (else: unshare, fork the init)
    "NET": 2,                # descriptor NET is a network namespace to join, lo up
    "ROOT": 4,               # descriptor ROOT is the root tree (mounts.build_root); else 'r' records
    "SET_UID": 8,
    "SET_GID": 16,
    "CLEAR_GROUPS": 32,
    "CONTROLLING_TTY": 64,
    "LAUNCH": 128,           # descriptor LAUNCH is the mount namespace to copy (mounts.launch_namespace)
    "OWN_USERNS": 256,       # a user namespace of the command's own, mapping uid/gid to the launcher's ids
}
# Mount step codes, by MountStep.action; the last five only in the root tree's own steps ('r').
ACTIONS = {
    "private": 1, "root": 2, "bind": 3, "symlink": 4, "mask_file": 5, "mask_dir": 6, "proc": 7,
    "sysfs": 8, "console": 9, "detach_old_root": 10, "seal_root": 11,
    "bind_over": 12, "etc": 13, "dev": 14, "devpts": 15, "tmpfs": 16,
}
# A mount step's bits.  SOURCE_FD: its source is the decimal number of a descriptor the
# helper passed (a detached clone of the host path, mounts.detach_sources).
STEP_BITS = {"SOURCE_IS_FILE": 1, "NOFOLLOW": 2, "SOURCE_FD": 4}
# Bounds the launcher enforces on a plan; each string's bound counts its NUL.
LIMITS = {
    "SETUP_FAILED": 125,               # the launcher's exit status when the jail could not be built
    "PLAN_MAX_BYTES": 8 << 20,         # argv and env are bounded by ARG_MAX (a few MiB)
    "MAX_STEPS": 512,                  # of each kind ('m', 'r')
    "MAX_CGROUPS": 16,
    "MAX_FILTER_INSNS": 4096,          # BPF_MAXINSNS
    "MAX_HOSTNAME": 65,                # HOST_NAME_MAX + 1
    "MAX_PATH": 4096,                  # PATH_MAX: cwd, a step's target, source and data
    "MAX_STEP_NAME": 2 * 4096 + 64,    # MountStep.describe: an action, a source and a target
    "MAX_ARG": 32 * 4096,              # MAX_ARG_STRLEN: one argv or env string
    "MAX_TIMENS": 4096,                # the text for /proc/self/timens_offsets
    "NOTIFY_KEY": 8,                   # a run's key ('k'), after each message's kind (unotify.py)
}

# The launcher's words on a command's stderr that the front end reads back: a script whose
# ``#!`` interpreter the jail does not show is said as "ccw: SCRIPT: bad interpreter: PATH
# (named by SCRIPT's #! line): ..." (ccw_jail.c; a program whose ELF loader it does not
# show, "... (named by PROGRAM's ELF program header)"), in which mcp_server/core/expose.py finds
# PATH to say what to expose (read there through sandbox/usage_words.py).  Not in the
# plan's magic: a launcher with other words reads the same plans, and is only less helpful.
TEXTS = {"BAD_INTERPRETER": "bad interpreter: ", "NAMED_BY": " (named by "}


def _body() -> str:
    lines = [f"#define FD_{name} {value}" for name, value in DESCRIPTORS.items()]
    lines += [f"#define {name} {value}" for name, value in LIMITS.items()]
    lines.append("enum plan_option {")
    lines += [f"    PLAN_{name} = {value}," for name, value in OPTIONS.items()]
    lines += ["};", "enum step_action {"]
    lines += [f"    STEP_{name.upper()} = {value}," for name, value in ACTIONS.items()]
    lines += ["};", f"#define STEP_ACTION_MIN {min(ACTIONS.values())}",
              f"#define STEP_ACTION_MAX {max(ACTIONS.values())}", "enum step_bits {"]
    lines += [f"    STEP_{name} = {value}," for name, value in STEP_BITS.items()]
    lines.append("};")
    return "\n".join(lines) + "\n"


MAGIC = b"CCWJ" + hashlib.sha256(_body().encode()).digest()[:4]


def header() -> str:
    """The C header of this table (``jail_interface.h``), the plan's magic included."""
    magic = ", ".join(f"0x{byte:02x}" for byte in MAGIC)
    return ("/* Generated from sandbox/jail_interface.py at build time (setup.py): edit that table. */\n"
            "#ifndef CCW_JAIL_INTERFACE_H\n#define CCW_JAIL_INTERFACE_H\n"
            f"#define PLAN_MAGIC {{{magic}}}\n{_body()}{_texts()}#endif\n")


def _texts() -> str:
    # json's quoting is C's for these plain ASCII words
    assert all(text.isascii() and text.isprintable() for text in TEXTS.values())
    return "".join(f"#define TEXT_{name} {json.dumps(text)}\n" for name, text in TEXTS.items())


if __name__ == "__main__":
    sys.stdout.write(header())
