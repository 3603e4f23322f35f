/* The jail's steps, in order (contain): namespaces, the mount plan, hostname, lo, the
 * time namespace, rootless the command's user namespace, privileges, cwd.  What each step
 * does and why is in the Python modules that plan it (sandbox/namespaces.py, mounts.py,
 * mounttree.py, rootcaps.py, seccomp.py, and contain.py's essay on the order); this file
 * applies their plan, and an error names the step as the plan does (MountStep.describe),
 * with its errno.
 *
 * Kernel structures and flags come from the C library's and the kernel's headers by
 * name: the mount API (struct mount_attr, MOUNT_ATTR_*, OPEN_TREE_CLONE,
 * MOVE_MOUNT_F_EMPTY_PATH) from glibc 2.36's <sys/mount.h> (it cannot be included
 * together with <linux/mount.h>), struct open_how from <linux/openat2.h>, and the
 * capability header from <linux/capability.h> (linux-libc-dev, which gcc's libc6-dev
 * pulls in).  glibc has no wrappers for open_tree, move_mount, mount_setattr or openat2
 * in every version a build may meet, so those go through syscall(). */
#define _GNU_SOURCE
#include "jail.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/openat2.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef MOUNT_ATTR_RDONLY
#error "the mount API's names come from glibc 2.36's <sys/mount.h> (Debian 12 or later)"
#endif
#define OLD_ROOT "/.oldroot"
/* build_root hands a root step's MOUNT_ATTR_* set to mount(2) as its flags. */
_Static_assert(MS_RDONLY == MOUNT_ATTR_RDONLY && MS_NOSUID == MOUNT_ATTR_NOSUID && MS_NODEV == MOUNT_ATTR_NODEV
               && MS_NOEXEC == MOUNT_ATTR_NOEXEC, "MS_* and MOUNT_ATTR_* differ");

static const char *current; /* the step under way, for fail_errno */

static void check(long result, const char *call)
{
    if (result < 0)
        fail_errno(current, call);
}

static int open_tree_(int dirfd, const char *path, unsigned flags)
{
    return (int)syscall(SYS_open_tree, dirfd, path, flags);
}

static long move_mount_(int from, const char *from_path, int to, const char *to_path, unsigned flags)
{
    return syscall(SYS_move_mount, from, from_path, to, to_path, flags);
}

static long mount_setattr_(int dirfd, const char *path, unsigned flags, uint64_t attr_set)
{
    struct mount_attr attr = {.attr_set = attr_set};
    return syscall(SYS_mount_setattr, dirfd, path, flags, &attr, sizeof attr);
}

static int openat2_(const char *path, uint64_t flags, uint64_t resolve)
{
    struct open_how how = {.flags = flags, .resolve = resolve};
    return (int)syscall(SYS_openat2, AT_FDCWD, path, &how, sizeof how);
}

static int make(const char *path, int is_file)
{
    return is_file ? mknod(path, S_IFREG | 0644, 0) : mkdir(path, 0755);
}

/* A mount point: one mkdir (or mknod of an empty file) when its parent exists, else the
 * missing parents first, found by cutting the path at its slashes (up) and made putting
 * them back (down): a loop over one buffer, bounded by the path's length.  An existing
 * path of any type is left as it is. */
static void mountpoint(const char *path, int is_file)
{
    char buffer[PATH_MAX];
    size_t length = strlen(path);
    if (make(path, is_file) == 0 || errno == EEXIST)
        return;
    if (errno != ENOENT)
        fail_errno(current, is_file ? "mknod" : "mkdir");
    if (length >= sizeof buffer) {
        errno = ENAMETOOLONG;
        fail_errno(current, "mkdir");
    }
    memcpy(buffer, path, length + 1);
    for (;;) { /* up, to the nearest ancestor that exists or could be made */
        char *slash = strrchr(buffer, '/');
        if (slash == NULL || slash == buffer)
            fail_errno(current, "mkdir"); /* errno: ENOENT, the top is missing */
        *slash = '\0';
        if (mkdir(buffer, 0755) == 0 || errno == EEXIST)
            break;
        if (errno != ENOENT)
            fail_errno(current, "mkdir");
    }
    for (size_t made = strlen(buffer); made < length; made = strlen(buffer)) { /* down */
        buffer[made] = '/';
        if (strlen(buffer) < length && mkdir(buffer, 0755) < 0 && errno != EEXIST)
            fail_errno(current, "mkdir");
    }
    check(make(path, is_file), is_file ? "mknod" : "mkdir");
}

/* A path or option text built with snprintf: truncation is the step's failure (ENAMETOOLONG). */
static const char *format(char *buffer, size_t size, const char *what, const char *pattern, ...)
{
    va_list values;
    int n;
    va_start(values, pattern);
    n = vsnprintf(buffer, size, pattern, values);
    va_end(values);
    if (n < 0 || (size_t)n >= size) {
        errno = ENAMETOOLONG;
        fail_errno(current, what);
    }
    return buffer;
}

static void attach(int tree, const char *target, uint32_t attrs)
{
    check(tree, "open_tree");
    if (attrs)
        check(mount_setattr_(tree, "", AT_EMPTY_PATH | AT_RECURSIVE, attrs), "mount_setattr");
    check(move_mount_(tree, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH), "move_mount");
    close(tree);
}

static void bind_source(const struct mount_step *step, const char *source, uint32_t attrs)
{
    mountpoint(step->target, step->bits & STEP_SOURCE_IS_FILE);
    if (step->bits & STEP_SOURCE_FD) { /* the helper's clone: resolved (nofollow where asked) in its namespace */
        attach(step->source_fd, step->target, 0);
    } else if (step->bits & STEP_NOFOLLOW) { /* the directory reached following no symlink (syscalls.bind) */
        int fd = openat2_(source, O_PATH | O_DIRECTORY | O_CLOEXEC, RESOLVE_NO_SYMLINKS);
        check(fd, "openat2");
        attach(open_tree_(fd, "", OPEN_TREE_CLONE | O_CLOEXEC | AT_RECURSIVE | AT_EMPTY_PATH), step->target, 0);
        close(fd);
    } else {
        check(mount(source, step->target, NULL, MS_BIND | MS_REC, NULL), "mount(MS_BIND)");
    }
    if (attrs)
        check(mount_setattr_(AT_FDCWD, step->target, AT_RECURSIVE, attrs), "mount_setattr");
}

/* The terminal as /dev/console, only if the helper's path for it leads to descriptor 0's inode. */
static void console(const struct mount_step *step)
{
    struct stat found, terminal;
    int from_fd = (step->bits & STEP_SOURCE_FD) != 0; /* the helper's clone of it, already detached */
    int node = from_fd ? step->source_fd : openat2_(step->source, O_PATH | O_CLOEXEC, RESOLVE_NO_SYMLINKS);
    if (node < 0) /* no terminal at that path (or a symlink to it): the jail has no /dev/console */
        return;
    /* A failed fstat is "not the terminal", as a mismatch is: no console, no error. */
    if (fstat(node, &found) == 0 && fstat(0, &terminal) == 0 && S_ISCHR(found.st_mode)
        && found.st_dev == terminal.st_dev && found.st_ino == terminal.st_ino) {
        mountpoint(step->target, 1);
        attach(from_fd ? node : open_tree_(node, "", OPEN_TREE_CLONE | O_CLOEXEC | AT_RECURSIVE | AT_EMPTY_PATH),
               step->target, step->attrs);
        if (from_fd)
            return; /* attach closed it */
    }
    close(node);
}

/* A path under the staging dir: "/tmp" + "/usr". */
static const char *under(char *buffer, size_t size, const char *top, const char *path)
{
    return format(buffer, size, "path", "%s%s", top, path);
}

/* The jail's /etc: a read-only overlay whose top layer, a tiny tmpfs parked on the empty
 * /.oldroot until the overlay holds it, has an empty mode-0 file for each hidden name and
 * the jail's own hosts file (data: the names, '/'-separated, then after a newline the
 * hosts file's text, mounts.ETC_HOSTS; mounts.py's essay on why by name). */
static void etc_overlay(const char *top, const struct mount_step *step, const char *at)
{
    char park[PATH_MAX], name[PATH_MAX], lower[2 * PATH_MAX + 16];
    const char *names = step->data;
    under(park, sizeof park, top, OLD_ROOT);
    check(mount("none", park, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=4k,nr_inodes=16"), "mount(tmpfs)");
    while (*names != '\0' && *names != '\n') {
        size_t length = strcspn(names, "/\n");
        if (length == 0) {
            errno = EINVAL;
            fail_errno(current, "hidden name");
        }
        format(name, sizeof name, "hidden name", "%s/%.*s", park, (int)length, names);
        check(mknod(name, S_IFREG, 0), "mknod"); /* mode 0: not even its owner reads it */
        names += length + (names[length] == '/');
    }
    if (*names == '\n') {
        const char *hosts = names + 1;
        size_t left = strlen(hosts);
        int fd = open(format(name, sizeof name, "hosts", "%s/hosts", park), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                      0644);
        check(fd, "open(hosts)");
        while (left > 0) { /* a tmpfs takes a few hundred bytes whole; a short write goes on */
            ssize_t wrote = write(fd, hosts, left);
            check(wrote, "write(hosts)");
            hosts += wrote;
            left -= (size_t)wrote;
        }
        close(fd);
    }
    format(lower, sizeof lower, "overlay options", "lowerdir=%s:%s", park, step->source);
    check(mount("ccw-etc", at, "overlay", step->attrs, lower), "mount(overlay)");
    check(umount2(park, MNT_DETACH), "umount2");
}

/* Where no tree could be built ahead, detached (kernels before 6.15): the same tree,
 * built in place on the staging dir (mounts.build_root with attach_at).  MS_RDONLY,
 * MS_NOSUID, MS_NODEV and MS_NOEXEC have the bits of their MOUNT_ATTR_* namesakes. */
static void build_root(const struct plan *plan, const char *top)
{
    static const char *const dev_links[][2] = {{"fd", "/proc/self/fd"}, {"stdin", "/proc/self/fd/0"},
        {"stdout", "/proc/self/fd/1"}, {"stderr", "/proc/self/fd/2"}, {"ptmx", "pts/ptmx"}};
    char at[PATH_MAX], link[PATH_MAX + 16];
    /* Source "none", as fsmount names a new superblock: the same tree whoever built it. */
    check(mount("none", top, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m"), "mount(tmpfs)");
    check(mkdir(under(at, sizeof at, top, OLD_ROOT), 0700), "mkdir");
    for (size_t i = 0; i < plan->nroot_steps; i++) {
        const struct mount_step *step = &plan->root_steps[i];
        under(at, sizeof at, top, step->target);
        current = step->name;
        switch (step->action) {
        case STEP_BIND:
        case STEP_BIND_OVER: {
            struct mount_step placed = *step;
            placed.target = at;
            if (step->action == STEP_BIND)
                bind_source(&placed, step->source, step->attrs);
            else { /* onto a path the overlay below already shows: no mount point to make */
                check(mount(step->source, at, NULL, MS_BIND | MS_REC, NULL), "mount(MS_BIND)");
                check(mount_setattr_(AT_FDCWD, at, AT_RECURSIVE, step->attrs), "mount_setattr");
            }
            break;
        }
        case STEP_ETC: mountpoint(at, 0); etc_overlay(top, step, at); break;
        case STEP_SYMLINK: check(symlink(step->data, at), "symlink"); break;
        case STEP_DEV:
        case STEP_DEVPTS:
        case STEP_TMPFS: {
            const char *type = step->action == STEP_DEVPTS ? "devpts" : "tmpfs";
            mountpoint(at, 0);
            check(mount("none", at, type, step->attrs, step->data), "mount");
            for (size_t l = 0; step->action == STEP_DEV && l < sizeof dev_links / sizeof *dev_links; l++) {
                format(link, sizeof link, "path", "%s/%s", at, dev_links[l][0]);
                check(symlink(dev_links[l][1], link), "symlink");
            }
            break;
        }
        default:
            errno = EINVAL;
            fail_errno(current, "unknown root tree step");
        }
    }
    current = "root";
    check(mount(NULL, top, NULL, MS_REC | MS_PRIVATE, NULL), "mount(MS_PRIVATE)");
}

static void enter_root(const struct plan *plan, const struct mount_step *step)
{
    if (plan->options & PLAN_ROOT) {
        check(move_mount_(FD_ROOT, "", AT_FDCWD, step->target, MOVE_MOUNT_F_EMPTY_PATH), "move_mount");
        close(FD_ROOT);
    } else {
        build_root(plan, step->target);
        current = step->name;
    }
    check(chdir(step->target), "chdir");
    check(syscall(SYS_pivot_root, ".", OLD_ROOT + 1), "pivot_root");
    check(chdir("/"), "chdir");
}

static void enter_step(const struct plan *plan, const struct mount_step *step)
{
    const unsigned long hidden = MS_NOSUID | MS_NODEV | MS_NOEXEC;
    current = step->name;
    switch (step->action) {
    case STEP_BIND: bind_source(step, step->source, step->attrs); break;
    case STEP_SYMLINK: check(symlink(step->data, step->target), "symlink"); break;
    case STEP_MASK_FILE: check(mount("/dev/null", step->target, NULL, MS_BIND, NULL), "mount(MS_BIND)"); break;
    case STEP_MASK_DIR:
        mountpoint(step->target, 0);
        check(mount("tmpfs", step->target, "tmpfs", MS_RDONLY | hidden, "mode=0555"), "mount(tmpfs)");
        break;
    case STEP_PROC:
        mountpoint(step->target, 0);
        check(mount("proc", step->target, "proc", hidden, NULL), "mount(proc)");
        break;
    case STEP_SYSFS:
        mountpoint(step->target, 0);
        if (mount("sysfs", step->target, "sysfs", MS_RDONLY | hidden, NULL) < 0) {
            struct mount_step host = *step;
            host.bits = 0;
            bind_source(&host, OLD_ROOT "/sys", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC);
        }
        break;
    case STEP_PRIVATE: check(mount(NULL, step->target, NULL, MS_REC | MS_PRIVATE, NULL), "mount(MS_PRIVATE)"); break;
    case STEP_ROOT: enter_root(plan, step); break;
    case STEP_CONSOLE: console(step); break;
    case STEP_DETACH_OLD_ROOT:
        check(umount2(step->target, MNT_DETACH), "umount2");
        check(rmdir(step->target), "rmdir");
        break;
    case STEP_SEAL_ROOT: /* not recursive: /dev/pts, /dev/shm, /tmp, $HOME, the workspace stay writable */
        check(mount_setattr_(AT_FDCWD, step->target, 0, MOUNT_ATTR_RDONLY), "mount_setattr");
        check(mount_setattr_(AT_FDCWD, "/dev", 0, MOUNT_ATTR_RDONLY), "mount_setattr");
        break;
    default:
        errno = EINVAL;
        fail_errno(current, "unknown mount step");
    }
}

static void loopback_up(void)
{
    struct ifreq request;
    int sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    check(sock, "socket");
    memset(&request, 0, sizeof request);
    strcpy(request.ifr_name, "lo");
    check(ioctl(sock, SIOCGIFFLAGS, &request), "ioctl(SIOCGIFFLAGS)");
    request.ifr_flags |= IFF_UP;
    check(ioctl(sock, SIOCSIFFLAGS, &request), "ioctl(SIOCSIFFLAGS)");
    close(sock);
}

/* One write to a file of /proc/self (the jail's own /proc, mounted by now). */
static void write_self(const char *path, const void *text, size_t length)
{
    char call[64];
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    check(fd, format(call, sizeof call, "open", "open %s", path));
    errno = 0;
    if (write(fd, text, length) != (ssize_t)length) {
        if (errno == 0)
            errno = EIO; /* short: the kernel took part of it */
        fail_errno(current, format(call, sizeof call, "write", "write %s", path));
    }
    close(fd);
}

static void enter_time(const struct plan *plan)
{
    check(unshare(CLONE_NEWTIME), "unshare(CLONE_NEWTIME)");
    write_self("/proc/self/timens_offsets", plan->timens, plan->timens_len);
}

/* Rootless (PLAN_OWN_USERNS): a user namespace of the command's own, in which it is the
 * user's own uid and gid (the plan's), mapped to this process's ids in the helper's
 * namespace (namespaces.py's essay).  One line for our own euid, and setgroups denied
 * first: what a process without CAP_SETUID over the parent may map.  Every other
 * namespace of the jail stays owned by the helper's; the full bounding set this gives
 * back is emptied by drop_privileges, next. */
static void enter_user(const struct plan *plan)
{
    char map[64];
    unsigned outer_uid = (unsigned)geteuid(), outer_gid = (unsigned)getegid(); /* cannot fail */
    current = "user namespace of the command's own";
    check(unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)");
    write_self("/proc/self/setgroups", "deny", 4);
    format(map, sizeof map, "uid_map", "%u %u 1", plan->uid, outer_uid);
    write_self("/proc/self/uid_map", map, strlen(map));
    format(map, sizeof map, "gid_map", "%u %u 1", plan->gid, outer_gid);
    write_self("/proc/self/gid_map", map, strlen(map));
}

/* The jail's filter in its notifying form (sandbox/unotify.py's essay), instead of the plain
 * one.  Its listener stays with the init, which polls it, until the jail's first notification
 * is pending (hand_listener): a run that renames and deletes nothing costs the helper nothing
 * more than its record.  A kernel that refuses it gets the plain filter, and the helper an
 * 'F' on the socket (it attributes as before).  Once installed, a listener always stays open
 * somewhere: the init closes its copy only after the handover (the helper's copy answers
 * from then on) or at its exit, when no process of the jail is left to be failed with
 * ENOSYS.  The socket is the capsule's, each of its runs' inits holding a copy: every
 * message names its run by the key the plan gave ('k'), after its kind. */
static int held_listener = -1;

/* The message of one kind ('L', 'F') and the run's key; its length. */
static size_t notify_message(const struct plan *plan, char kind, char message[static 1 + NOTIFY_KEY])
{
    message[0] = kind;
    if (plan->notify_key == NULL)
        return 1;
    memcpy(message + 1, plan->notify_key, NOTIFY_KEY);
    return 1 + NOTIFY_KEY;
}

/* The run's one filter, the jail's own with the rename family notified (seccomp.py
 * build_program), installed with a new listener: 1.  A kernel that refuses it: the 'F'
 * sent, and 0, so that the caller installs the plain filter (plan->seccomp). */
static int install_listener(const struct plan *plan)
{
    struct sock_fprog program = {(unsigned short)(plan->notify_len / 8), (struct sock_filter *)plan->notify};
    char refused[1 + NOTIFY_KEY];
    size_t length;
    held_listener = (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &program);
    if (held_listener >= 0)
        return 1;
    length = notify_message(plan, 'F', refused);
    errno = 0;
    if (send((int)plan->notify_fd, refused, length, MSG_NOSIGNAL) != (ssize_t)length)
        fail_errno(current, "send(the seccomp filter refused)");
    close((int)plan->notify_fd);
    return 0;
}

int notify_listener(void)
{
    return held_listener;
}

/* A notification is pending: the listener to the helper (SCM_RIGHTS), which answers it and
 * every later one; this copy and the socket closed.  A helper that cannot take it is gone,
 * and the jail with it (PDEATHSIG). */
void hand_listener(const struct plan *plan)
{
    union { char buffer[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } control;
    char handed[1 + NOTIFY_KEY];
    struct iovec data = {handed, notify_message(plan, 'L', handed)};
    struct msghdr message;
    struct cmsghdr *header;
    memset(&control, 0, sizeof control);
    memset(&message, 0, sizeof message);
    message.msg_iov = &data;
    message.msg_iovlen = 1;
    message.msg_control = control.buffer;
    message.msg_controllen = sizeof control.buffer;
    header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(header), &held_listener, sizeof held_listener);
    current = "hand the seccomp listener to the helper";
    errno = 0;
    if (sendmsg((int)plan->notify_fd, &message, MSG_NOSIGNAL) != (ssize_t)data.iov_len)
        fail_errno(current, "sendmsg(the seccomp listener)");
    close(held_listener);
    close((int)plan->notify_fd);
    held_listener = -1;
}

/* Caller's uid/gid, no capabilities but keep_caps (rootcaps.py), no_new_privs, not
 * dumpable, PDEATHSIG again (a credential change clears it) with the parent re-checked,
 * no core dumps, seccomp last (contain.py's essay). */
static void drop_privileges(const struct plan *plan)
{
    struct __user_cap_header_struct header = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    uint32_t low = (uint32_t)plan->keep_caps, high = (uint32_t)(plan->keep_caps >> 32);
    struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {
        {.effective = low, .permitted = low, .inheritable = 0}, {.effective = high, .permitted = high, .inheritable = 0}};
    struct rlimit no_core = {0, 0};
    struct sock_fprog program = {(unsigned short)(plan->seccomp_len / 8), (struct sock_filter *)plan->seccomp};
    current = "drop privileges";
    for (uint32_t cap = 0; cap <= plan->last_cap; cap++)
        if (!(plan->keep_caps >> cap & 1))
            check(prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "prctl(PR_CAPBSET_DROP)");
    if (plan->options & PLAN_CLEAR_GROUPS)
        check(syscall(SYS_setgroups, 0, NULL), "setgroups");
    if (plan->options & PLAN_SET_GID)
        check(syscall(SYS_setresgid, plan->gid, plan->gid, plan->gid), "setresgid");
    if (plan->options & PLAN_SET_UID)
        check(syscall(SYS_setresuid, plan->uid, plan->uid, plan->uid), "setresuid");
    check(syscall(SYS_capset, &header, data), "capset");
    check(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)");
    check(prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)");
    check(prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)");
    require_parent(current);
    check(setrlimit(RLIMIT_CORE, &no_core), "setrlimit(RLIMIT_CORE)");
    if (plan->notify != NULL && install_listener(plan))
        return;
    if (plan->seccomp != NULL)
        check(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program, 0, 0), "prctl(PR_SET_SECCOMP)");
}

void contain(const struct plan *plan)
{
    mode_t helper_umask;
    if (plan->options & PLAN_LAUNCH) { /* the copy below is of its one mount, not of the helper's table */
        current = "setns into the launch mount namespace";
        check(setns(FD_LAUNCH, CLONE_NEWNS), "setns");
        close(FD_LAUNCH);
    }
    if (plan->options & PLAN_NET) {
        current = "setns into the prepared network namespace";
        check(setns(FD_NET, CLONE_NEWNET), "setns");
        close(FD_NET);
        current = "unshare mount, uts, ipc, cgroup namespaces";
        check(unshare((int)(plan->flags & ~(uint32_t)CLONE_NEWNET)), "unshare");
    } else {
        current = "unshare mount, net, uts, ipc, cgroup namespaces";
        check(unshare((int)plan->flags), "unshare");
    }
    /* Mount points are made for the caller to traverse, whatever the helper's umask. */
    helper_umask = umask(022); /* umask cannot fail */
    for (size_t i = 0; i < plan->nsteps; i++)
        enter_step(plan, &plan->steps[i]);
    umask(helper_umask);
    current = "sethostname";
    check(sethostname(plan->hostname, strlen(plan->hostname)), "sethostname");
    if (!(plan->options & PLAN_NET)) {
        current = "lo up";
        loopback_up();
    }
    if (plan->timens != NULL) {
        current = "time namespace";
        enter_time(plan);
    }
    if (plan->options & PLAN_OWN_USERNS)
        enter_user(plan);
    drop_privileges(plan);
    {
        char step[MAX_PATH + 8];
        current = "chdir";
        current = format(step, sizeof step, "chdir", "chdir %s", plan->cwd);
        check(chdir(plan->cwd), "chdir");
    }
}
