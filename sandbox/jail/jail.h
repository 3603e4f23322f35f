/* ccw-jail: the jail's launcher and init (see ccw_jail.c for why it is C).
 *
 * The plan the helper writes (sandbox/jail_launcher.py encodes it; plan.c reads it), on
 * descriptor FD_PLAN, a memfd read to its end:
 *
 *     PLAN_MAGIC record* ; record = tag (1 byte) | length (u32, native order) | payload
 *
 *     'O' options: nine u32: unshare flags, option bits (PLAN_*), uid, gid, last_cap,
 *         the END signal's number, the number of cgroup files, keep_caps low and high word
 *     'h' hostname            't' time namespace offsets (text for timens_offsets)
 *     'f' seccomp program (struct sock_filter[])
 *     'u' the seccomp program in its notifying form (only where a capsule's runs overlap;
 *         installed instead of 'f', which a kernel refusing it gets): u32, the descriptor of
 *         the socket its listener is sent on at the first notification, or an 'F' if the
 *         kernel refuses it (after the bind sources), then struct sock_filter[]
 *         (sandbox/unotify.py)
 *     'k' the run's key (NOTIFY_KEY bytes, with 'u'): each message on that socket is its
 *         kind ('L' or 'F') and then the key, which tells the helper whose it is (the
 *         socket is the capsule's, shared by its runs' inits: unotify.py)
 *     'c' cwd                 'a' one argv element (in order; one at least)
 *     'e' one "NAME=value" of the command's environment
 *     'm' one mount step: three u32 (action, MOUNT_ATTR_* set, STEP_* bits), then four
 *         NUL-terminated strings: target, source, data, the step's name for errors
 *     'r' one step of the root tree, as 'm' (only without PLAN_ROOT: the launcher builds
 *         the tree itself, attached, where the kernel could not build it detached)
 *     'Z' the end (empty): a plan without it was cut short
 *
 * Every string is NUL-free before its terminator and within its bound (MAX_HOSTNAME,
 * MAX_PATH, MAX_STEP_NAME, MAX_ARG: each counts the NUL); any other tag, a short record,
 * a missing field or a string past its bound is refused with an "E" report.
 *
 * The descriptors: 0-2 the command's stdio, FD_REPORT the report pipe, FD_PLAN the plan,
 * FD_NET a network namespace (PLAN_NET), FD_ROOT the root tree (PLAN_ROOT), FD_LAUNCH the
 * mount namespace to copy (PLAN_LAUNCH), then from FD_CGROUPS on: the exec cgroup's
 * "tasks" files, the binds' sources (STEP_SOURCE_FD: the 'm' steps' in record order,
 * then the 'r' steps'), and the notifying filter's socket ('u').
 *
 * The numbers (FD_*, PLAN_*, STEP_*, the bounds, PLAN_MAGIC) are not written here:
 * jail_interface.h is generated at build time from the table the helper also imports,
 * sandbox/jail_interface.py (setup.py write_interface_header).  PLAN_MAGIC ends in a
 * digest of that table, so a launcher built from another table refuses the plan.
 */
#ifndef CCW_JAIL_H
#define CCW_JAIL_H

#include <stddef.h>
#include <stdint.h>

#include "jail_interface.h"

struct mount_step {
    uint32_t action, attrs, bits;
    int source_fd; /* with STEP_SOURCE_FD: the source's number, parsed and checked (plan.c); else -1 */
    const char *target, *source, *data, *name;
};

struct plan {
    uint32_t flags, options, uid, gid, last_cap, end_signal, cgroups;
    uint64_t keep_caps;
    const char *hostname, *timens, *cwd;
    size_t timens_len;
    const void *seccomp;
    size_t seccomp_len;
    const void *notify; /* the filter's notifying form ('u'), NULL without; its listener goes over notify_fd */
    size_t notify_len;
    uint32_t notify_fd;
    const void *notify_key; /* the run's key ('k'), NULL without: then a message is its kind alone */
    char **argv, **envp; /* NULL-terminated */
    char *bytes; /* the plan as read, which every string above points into */
    size_t nsteps, nroot_steps;
    struct mount_step steps[MAX_STEPS];
    struct mount_step root_steps[MAX_STEPS]; /* without PLAN_ROOT: the tree to build in place */
};

/* plan.c */
int plan_read(int fd, struct plan *plan, const char **why);

/* ccw_jail.c: reports to the helper, and the end of a failed step ("E": its name, errno, text) */
void report(char kind, const void *payload, size_t length);
_Noreturn void fail(const char *step, int number, const char *text);
_Noreturn void fail_errno(const char *step, const char *call);
/* ccw_jail.c: after PR_SET_PDEATHSIG, end quietly if the parent is already gone (its
 * death came before the signal was armed, so it will never be sent) */
void require_parent(const char *step);

/* steps.c: the jail's steps (namespaces, mounts, privileges), each failing with an "E" report */
void contain(const struct plan *plan);
/* the notifying filter's listener while the init holds it (-1: none, or handed over), and its handover */
int notify_listener(void);
void hand_listener(const struct plan *plan);

#endif
