/* ccw-jail: the jail's launcher and its init, spawned by the helper (sandbox/jail_launcher.py).
 *
 * Why C, in a project that is Python but for this and the port forwarder: a measured
 * reason, as any C here needs one.  Issue 27's profile measured what a jail cost when its first
 * child and its init were forks of the helper, a 28 MB multi-threaded Python process:
 * the parent's fork() 1.3-2.0 ms, 1.3-2.8 ms more until the child ran its first line,
 * copy-on-write faults through every Python step of the jail build (the mounts took
 * 1.8 ms in Python), and at the end 2.5-6.5 ms for the init's exit (exit_mm of its copy
 * of the helper's image) before the helper saw the hang-up; rootless, a second Python
 * fork 3.4 ms.  posix_spawn of a small program from the same helper returns in 0.14 ms.
 * So the helper still computes the whole jail in Python (contain.prepare: namespaces,
 * the flat list of mount steps, credentials, the seccomp program, argv/env/cwd), writes
 * it to a memfd (format: jail.h) and posix_spawns this program, which applies it: the
 * work bubblewrap does in C.
 *
 * What the plan decides, this program does not: which namespaces, which mounts, which
 * privileges.  What this program decides itself, as a shell or an init would:
 *   - how the command is found: as execvp finds it, along the PATH of the command's own
 *     environment, else /bin:/usr/bin (os.defpath), a name with a '/' taken as it is,
 *     a candidate path longer than 4095 bytes skipped as execvp skips it;
 *   - what a command that cannot be run becomes: exit status 127 when there is nothing
 *     to run, 126 when it cannot be run, with "ccw: NAME: reason" on its stderr; a script
 *     that is there but whose #! interpreter is not (ENOENT for a file that exists) is
 *     126 with "bad interpreter", as bash says it, naming the interpreter (bad_interpreter),
 *     and so is a program whose ELF loader is not;
 *   - which signals reach the command (FORWARDED below), and that the plan's END signal
 *     ends the whole jail (kill(-1) in its pid namespace);
 *   - that the init reaps everything before it reports the usage, and that it ends
 *     quietly when its parent died before PR_SET_PDEATHSIG was armed (require_parent).
 *
 * The order of things (steps.c contain follows contain.py's essay):
 *
 *   read the plan (FD_PLAN) → close every other descriptor of the helper's →
 *   PDEATHSIG, the parent re-checked → move into the exec's cgroups ("0" to each v1 tasks
 *   file: exec_cgroup.py's essay) → [rootless: unshare the pid namespace and fork the
 *   init; this process reports "P", waits for it, reports "A"] → the jail's steps
 *   (steps.c; with a launch namespace, FD_LAUNCH, it is joined first, so the new mount
 *   namespace copies its one mount and not the helper's table: mounts.py's essay) →
 *   posix_spawn the command (setsid, default signals, empty mask, the terminal as its
 *   controlling tty) → forward signals, END ends the jail, and at the first pending
 *   seccomp notification hand its listener to the helper (steps.c hand_listener) → at
 *   the command's exit "W", kill and reap the rest (reap_all) → "R".
 *
 * Reports go to FD_REPORT (supervise.py reads them): a big-endian u16 length, a kind
 * byte, the payload, one write each.  A failed step is an "E" report: the step's name,
 * its errno and a text (fail, fail_errno).  This program runs as root before it drops
 * privileges and reads only what the helper wrote, and still every syscall's result is
 * checked, or a comment says why it may fail unseen; the exceptions are close() of a
 * descriptor only read from or passed on (a failing close loses nothing, and Linux frees
 * the number anyway) and the libc sigset helpers called with valid signal numbers.  A
 * malformed plan ends in an "E" report (plan.c bounds every string), and the only
 * allocations are the plan's buffer and its two pointer arrays.
 */
#define _GNU_SOURCE
#include "jail.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static const int FORWARDED[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

/* Who must still live once PR_SET_PDEATHSIG is armed (require_parent).  A pid 1 has no
 * parent in its own pid namespace (getppid() is 0 there, whether the parent lives or
 * not), so the parent is also watched through a pipe it holds the other end of: the
 * report pipe, whose reader is the helper (POLLERR: no reader left), or in the rootless
 * init the pipe from the launcher (POLLHUP: no writer left). */
static pid_t expected_parent;
static int parent_pipe = FD_REPORT;

void report(char kind, const void *payload, size_t length)
{
    unsigned char message[3 + 3000];
    ssize_t written;
    if (length > 3000)
        length = 3000;
    message[0] = (unsigned char)((length + 1) >> 8);
    message[1] = (unsigned char)((length + 1) & 0xff);
    message[2] = (unsigned char)kind;
    memcpy(message + 3, payload, length);
    do /* one write below PIPE_BUF: atomic; nothing to do if the helper is gone */
        written = write(FD_REPORT, message, length + 3);
    while (written < 0 && errno == EINTR);
}

static void report_int(char kind, int value)
{
    unsigned char big[4] = {(unsigned char)((unsigned)value >> 24), (unsigned char)((unsigned)value >> 16),
                            (unsigned char)((unsigned)value >> 8), (unsigned char)value};
    report(kind, big, sizeof big);
}

/* The "E" report: the step's name, NUL, the errno in decimal, NUL, the text.  A message
 * past the report's bound is cut (it is read by a person; no path is built from it). */
_Noreturn void fail(const char *step, int number, const char *text)
{
    char payload[3000];
    int length = snprintf(payload, sizeof payload, "%s%c%d%c%s", step, 0, number, 0, text);
    report('E', payload, length < 0 ? 0 : (size_t)length >= sizeof payload ? sizeof payload - 1 : (size_t)length);
    _exit(SETUP_FAILED);
}

_Noreturn void fail_errno(const char *step, const char *call)
{
    int number = errno;
    char text[512];
    snprintf(text, sizeof text, "%s failed: %s", call, strerror(number));
    fail(step, number, text);
}

void require_parent(const char *step)
{
    struct pollfd watched = {parent_pipe, 0, 0};
    int polled = poll(&watched, 1, 0);
    if (polled < 0)
        fail_errno(step, "poll(the parent's pipe)");
    if ((expected_parent != 0 && getppid() != expected_parent) || (polled > 0 && (watched.revents & (POLLERR | POLLHUP))))
        fail(step, ESRCH, "the parent exited before PR_SET_PDEATHSIG was armed");
}

/* The rusage of every process reaped, and the peak the command inherited (rusage.pack). */
static void report_rusage(long inherited_kb)
{
    struct rusage children;
    unsigned char payload[40];
    uint64_t figures[5];
    /* RUSAGE_CHILDREN and a valid buffer: it fails only with EFAULT or EINVAL; zeros then,
     * not what the stack held ("R" must come: supervise.py waits for it after "W"). */
    if (getrusage(RUSAGE_CHILDREN, &children) < 0)
        memset(&children, 0, sizeof children);
    figures[0] = (uint64_t)(children.ru_utime.tv_sec + children.ru_stime.tv_sec) * 1000000u
                 + (uint64_t)(children.ru_utime.tv_usec + children.ru_stime.tv_usec);
    figures[1] = children.ru_maxrss > 0 ? (uint64_t)children.ru_maxrss : 0;
    figures[2] = children.ru_inblock > 0 ? (uint64_t)children.ru_inblock : 0;
    figures[3] = children.ru_oublock > 0 ? (uint64_t)children.ru_oublock : 0;
    figures[4] = inherited_kb > 0 ? (uint64_t)inherited_kb : 0;
    for (int i = 0; i < 5; i++)
        for (int byte = 0; byte < 8; byte++)
            payload[i * 8 + byte] = (unsigned char)(figures[i] >> (56 - 8 * byte));
    report('R', payload, sizeof payload);
}

/* "0" to each tasks file: this (single) thread moves itself, without the global lock. */
static void enter_cgroups(const struct plan *plan)
{
    for (uint32_t i = 0; i < plan->cgroups; i++) {
        int fd = FD_CGROUPS + (int)i;
        if (write(fd, "0", 1) != 1) {
            int number = errno;
            unsigned char payload[8] = {(unsigned char)(i >> 24), (unsigned char)(i >> 16), (unsigned char)(i >> 8),
                                        (unsigned char)i, (unsigned char)((unsigned)number >> 24),
                                        (unsigned char)((unsigned)number >> 16), (unsigned char)((unsigned)number >> 8),
                                        (unsigned char)number};
            report('C', payload, sizeof payload);
            _exit(SETUP_FAILED);
        }
        close(fd);
    }
}

/* A failed posix_spawnattr_* or file action: a step of the jail, with the errno it returned. */
static void spawn_check(int error, const char *call)
{
    if (error != 0) {
        errno = error;
        fail_errno("spawn the command", call);
    }
}

/* setsid, default dispositions and an empty mask for the command; the terminal as its
 * controlling tty where asked.  Neither object is destroyed: this process spawns once. */
static void spawn_attributes(const struct plan *plan, posix_spawnattr_t *attr, posix_spawn_file_actions_t *actions)
{
    sigset_t all, none;
    sigfillset(&all);
    sigdelset(&all, SIGKILL);
    sigdelset(&all, SIGSTOP);
    sigemptyset(&none);
    spawn_check(posix_spawnattr_init(attr), "posix_spawnattr_init");
    spawn_check(posix_spawn_file_actions_init(actions), "posix_spawn_file_actions_init");
    spawn_check(posix_spawnattr_setflags(attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK),
                "posix_spawnattr_setflags");
    spawn_check(posix_spawnattr_setsigdefault(attr, &all), "posix_spawnattr_setsigdefault");
    spawn_check(posix_spawnattr_setsigmask(attr, &none), "posix_spawnattr_setsigmask");
    /* A session leader opening a tty without O_NOCTTY takes it as its controlling terminal
     * (contain.py's essay): reopen the pty slave through /proc/self/fd/0 in a spare slot. */
    if (plan->options & PLAN_CONTROLLING_TTY) {
        spawn_check(posix_spawn_file_actions_addopen(actions, FD_REPORT, "/proc/self/fd/0", O_RDWR, 0),
                    "posix_spawn_file_actions_addopen");
        spawn_check(posix_spawn_file_actions_addclose(actions, FD_REPORT), "posix_spawn_file_actions_addclose");
    }
}

/* posix_spawn the command as execvp would find it (the essay says how); 0, or the errno
 * of the failure to run it.  `script` gets the first path that is there but gave ENOENT
 * (its #! interpreter, or its ELF loader, is missing), or stays empty. */
static int spawn(const struct plan *plan, pid_t *command, char script[PATH_MAX])
{
    const char *name = plan->argv[0], *path = NULL;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_t actions;
    int denied = 0, result = ENOENT;
    for (char **entry = plan->envp; *entry != NULL; entry++)
        if (strncmp(*entry, "PATH=", 5) == 0)
            path = *entry + 5;
    spawn_attributes(plan, &attr, &actions);
    script[0] = '\0';
    if (strchr(name, '/') != NULL) {
        result = posix_spawn(command, name, &actions, &attr, plan->argv, plan->envp);
        if (result == ENOENT && strlen(name) < PATH_MAX && access(name, F_OK) == 0)
            strcpy(script, name);
        return result == ENOTDIR || result == ESTALE || result == ENAMETOOLONG ? ENOENT : result;
    }
    if (path == NULL)
        path = "/bin:/usr/bin"; /* os.defpath */
    for (const char *dir = path;; dir = strchr(dir, ':') + 1) {
        char candidate[PATH_MAX];
        size_t length = strcspn(dir, ":");
        int n = length == 0 ? snprintf(candidate, sizeof candidate, "./%s", name)
                            : snprintf(candidate, sizeof candidate, "%.*s/%s", (int)length, dir, name);
        if (n > 0 && (size_t)n < sizeof candidate) { /* a longer one is skipped, as execvp does */
            result = posix_spawn(command, candidate, &actions, &attr, plan->argv, plan->envp);
            if (result == 0)
                return 0;
            if (result == EACCES)
                denied = 1;
            else if (result == ENOENT && script[0] == '\0' && access(candidate, F_OK) == 0)
                strcpy(script, candidate); /* n < PATH_MAX */
            else if (result != ENOENT && result != ENOTDIR && result != ESTALE && result != ENAMETOOLONG)
                return result;
        }
        if (dir[length] == '\0')
            break;
    }
    return denied ? EACCES : ENOENT;
}

/* The program interpreter (PT_INTERP: the dynamic loader) an ELF file of this machine's
 * byte order names, into `interp`; 0 when there is none or the headers are not sane.  Read
 * as the kernel's binfmt_elf reads them, within its bounds: the program headers in at most
 * 64 KiB, the path at most PATH_MAX bytes and ending in a NUL within its segment. */
static int elf_interpreter(int fd, const unsigned char *head, size_t got, char interp[PATH_MAX])
{
    int wide = head[EI_CLASS] == ELFCLASS64;
    size_t entry = wide ? sizeof(Elf64_Phdr) : sizeof(Elf32_Phdr);
    unsigned long table, count;
    unsigned short native = 1;
    if (got < sizeof(Elf64_Ehdr) || (!wide && head[EI_CLASS] != ELFCLASS32)
        || head[EI_DATA] != (*(unsigned char *)&native ? ELFDATA2LSB : ELFDATA2MSB))
        return 0;
    table = wide ? ((const Elf64_Ehdr *)head)->e_phoff : ((const Elf32_Ehdr *)head)->e_phoff;
    count = wide ? ((const Elf64_Ehdr *)head)->e_phnum : ((const Elf32_Ehdr *)head)->e_phnum;
    if ((wide ? ((const Elf64_Ehdr *)head)->e_phentsize : ((const Elf32_Ehdr *)head)->e_phentsize) != entry
        || count * entry > 65536)
        return 0;
    for (unsigned long i = 0; i < count; i++) {
        union { Elf64_Phdr wide; Elf32_Phdr narrow; } header;
        unsigned long offset, length;
        ssize_t read_n;
        if (pread(fd, &header, entry, (off_t)(table + i * entry)) != (ssize_t)entry)
            return 0;
        if ((wide ? header.wide.p_type : header.narrow.p_type) != PT_INTERP)
            continue;
        offset = wide ? header.wide.p_offset : header.narrow.p_offset;
        length = wide ? header.wide.p_filesz : header.narrow.p_filesz;
        if (length < 2 || length > PATH_MAX)
            return 0;
        read_n = pread(fd, interp, length, (off_t)offset);
        return read_n == (ssize_t)length && interp[length - 1] == '\0';
    }
    return 0;
}

/* "bad interpreter" into `message` for a `script` that is there but could not be run
 * (ENOENT), when its #! line, or its ELF program header, names an interpreter that is
 * not there; else 0.  Read as the kernel reads them (a #! line in the first 256 bytes,
 * BINPRM_BUF_SIZE; an ELF file's PT_INTERP), by this init, which is in the jail already
 * as the command's user and cwd: it opens what the command's exec opened and follows
 * nothing more (O_NONBLOCK: a FIFO put there since is not waited on).  A program whose
 * loader the jail lacks (one built under /nix/store, or for musl) said only "No such file
 * or directory" of a file that is plainly there. */
static int bad_interpreter(const char *name, const char *script, char *message, size_t size)
{
    char head[sizeof(Elf64_Ehdr) > 257 ? sizeof(Elf64_Ehdr) : 257], interp[PATH_MAX];
    const char *found = NULL, *how = "#! line", *fix = "recreate the venv with an interpreter the jail shows";
    struct stat st;
    ssize_t got = -1;
    size_t start, length;
    int fd = open(script, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return 0;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode))
        got = read(fd, head, sizeof head - 1);
    if (got >= SELFMAG && memcmp(head, ELFMAG, SELFMAG) == 0
        && elf_interpreter(fd, (const unsigned char *)head, (size_t)got, interp)) {
        found = interp;
        how = "ELF program header";
        fix = "run a build of it whose loader the jail shows";
    }
    close(fd);
    if (found == NULL) {
        if (got < 3 || head[0] != '#' || head[1] != '!')
            return 0;
        head[got] = '\0';
        start = 2 + strspn(head + 2, " \t");
        length = strcspn(head + start, " \t\n");
        if (length == 0)
            return 0;
        head[start + length] = '\0';
        found = head + start;
    }
    if (access(found, F_OK) == 0 || errno != ENOENT)
        return 0; /* it is there: what it lacks in turn is not this header's to say */
    return snprintf(message, size, "ccw: %s: " TEXT_BAD_INTERPRETER "%s" TEXT_NAMED_BY "%s's %s): %s; "
                    "the jail does not show it: expose its directory (capsule_create expose, ccw capsule create "
                    "--expose DIR), or %s\n", name, found, script, how, strerror(ENOENT), fix);
}

/* This image's peak resident size (VmHWM), what a command exec'd from it starts its peak
 * at.  Not getrusage(RUSAGE_SELF): its ru_maxrss still counts the helper's image, which
 * the vfork that spawned us shared until our own exec (rusage.py's essay). */
static long peak_kb(void)
{
    char status[4096];
    const char *line;
    ssize_t got = 0;
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) { /* the jail's own /proc, just mounted: without it the peak starts at 0 */
        got = read(fd, status, sizeof status - 1);
        close(fd);
    }
    status[got > 0 ? got : 0] = '\0';
    line = strstr(status, "\nVmHWM:");
    return line != NULL ? strtol(line + 7, NULL, 10) : 0;
}

/* Until ECHILD: every process of the jail reaped, so getrusage covers them all. */
static void reap_all(void)
{
    while (waitpid(-1, NULL, 0) > 0 || errno == EINTR)
        ;
}

/* pid 1: build the jail, spawn the command, forward signals, reap until it ends. */
static _Noreturn void jail_init(const struct plan *plan)
{
    sigset_t waited;
    pid_t command;
    int error, signals, status = 0;
    long inherited_kb;
    char script[PATH_MAX];
    contain(plan);
    /* Blocked since main, so none is lost before the loop; the command gets an empty mask. */
    sigemptyset(&waited);
    sigaddset(&waited, SIGCHLD);
    if (sigaddset(&waited, (int)plan->end_signal) < 0) /* the plan's number: glibc refuses its own 32 and 33 */
        fail_errno("jail init", "sigaddset(the END signal)");
    for (size_t i = 0; i < sizeof FORWARDED / sizeof *FORWARDED; i++)
        sigaddset(&waited, FORWARDED[i]);
    error = spawn(plan, &command, script);
    if (error != 0) { /* like a shell: 127 when there is nothing to run, 126 when it cannot be run */
        char message[4200 + 2 * PATH_MAX];
        int length = error == ENOENT && script[0] != '\0'
                         ? bad_interpreter(plan->argv[0], script, message, sizeof message) : 0;
        if (length > 0)
            error = ENOEXEC; /* there, but cannot be run: bash's 126 */
        else
            length = snprintf(message, sizeof message, "ccw: %s: %s\n", plan->argv[0],
                              error == ENOENT && strchr(plan->argv[0], '/') == NULL ? "command not found"
                                                                                     : strerror(error));
        if (length > 0 && write(2, message, (size_t)length < sizeof message ? (size_t)length : sizeof message - 1) < 0)
            length = 0; /* nobody reads the command's stderr any more: nothing to tell */
        report_int('W', (error == ENOENT ? 127 : 126) << 8);
        report_rusage(0);
        _exit(0);
    }
    for (int fd = 0; fd < 3; fd++)
        close(fd); /* only the jail holds the output pipes now */
    inherited_kb = peak_kb(); /* the peak the command inherits from this image (rusage.py) */
    /* The waited signals through a signalfd, so that one poll also sees the notifying
     * filter's listener (steps.c hand_listener): it goes to the helper at the jail's first
     * notification, and is not watched after. */
    signals = signalfd(-1, &waited, SFD_CLOEXEC);
    if (signals < 0)
        fail_errno("jail init", "signalfd");
    for (;;) {
        struct pollfd watched[2] = {{signals, POLLIN, 0}, {notify_listener(), POLLIN, 0}};
        struct signalfd_siginfo info;
        int signum;
        pid_t pid;
        if (poll(watched, watched[1].fd >= 0 ? 2 : 1, -1) < 0) {
            if (errno == EINTR)
                continue;
            fail_errno("jail init", "poll");
        }
        if (watched[1].fd >= 0 && watched[1].revents != 0)
            hand_listener(plan);
        if (!(watched[0].revents & POLLIN) || read(signals, &info, sizeof info) != (ssize_t)sizeof info)
            continue;
        signum = (int)info.ssi_signo;
        if (signum == SIGCHLD) {
            int done = 0;
            while ((pid = waitpid(-1, &status, WNOHANG)) > 0) /* orphans too: we are their init */
                if (pid == command) {
                    done = 1;
                    break;
                }
            if (done)
                break;
        } else if (signum == (int)plan->end_signal) {
            /* The helper's timeout: the command is reaped here.  ESRCH only when nothing
             * but this init is left, and then its SIGCHLD is already pending. */
            if (kill(-1, SIGKILL) < 0 && errno != ESRCH)
                fail_errno("jail init", "kill(-1, SIGKILL)");
        } else if (kill(command, signum) < 0 && errno != ESRCH) {
            /* ESRCH: the command was reaped, or its group is gone; its SIGCHLD ends the loop */
            fail_errno("jail init", "kill(the command)");
        }
    }
    report_int('W', status);
    /* Every other process of the pid namespace; ESRCH: there is none.  Then reap them all. */
    if (kill(-1, SIGKILL) < 0 && errno != ESRCH)
        fail_errno("jail init", "kill(-1, SIGKILL)");
    reap_all();
    report_rusage(inherited_kb);
    _exit(0);
}

/* Rootless: the helper could not make its thread's next child pid 1, so we unshare and fork it. */
static void fork_init(void)
{
    pid_t init;
    int status, lifeline[2];
    /* The init is pid 1 of the new namespace: it watches this process through the pipe's
     * read end (require_parent), this process holds its write end until it exits. */
    if (pipe2(lifeline, O_CLOEXEC) < 0)
        fail_errno("jail child", "pipe2");
    if (unshare(CLONE_NEWPID) < 0)
        fail_errno("unshare pid namespace", "unshare(CLONE_NEWPID)");
    init = fork();
    if (init < 0)
        fail_errno("jail child", "fork");
    if (init == 0) {
        close(lifeline[1]);
        if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) /* this process's death ends the namespace */
            fail_errno("jail child", "prctl(PR_SET_PDEATHSIG)");
        expected_parent = 0;
        parent_pipe = lifeline[0];
        require_parent("jail child");
        return;
    }
    close(lifeline[0]);
    report_int('P', init);
    for (int fd = 0; fd < 3; fd++)
        close(fd);
    while (waitpid(init, &status, 0) < 0)
        if (errno != EINTR)
            fail_errno("jail child", "waitpid(the init)");
    report_int('A', status);
    _exit(0);
}

/* "ccw-jail userns": the helper's one user namespace for idmapped mounts (sandbox/idmap.py).
 * Unshare it, say so with one byte on stdout, and hold it until stdin reaches its end: the
 * helper writes its maps and opens it meanwhile.  A multi-threaded helper cannot unshare a
 * user namespace itself, and this program is the one the helper already trusts to spawn. */
static int hold_user_namespace(void)
{
    char byte = 'U';
    ssize_t got;
    if (unshare(CLONE_NEWUSER) < 0) { /* "E" and the errno, in one write: jail_launcher.user_namespace */
        char said[16];
        int length = snprintf(said, sizeof said, "E%d", errno);
        ssize_t told = write(1, said, (size_t)length);
        (void)told; /* failing only when the helper is gone: nobody to tell */
        return SETUP_FAILED;
    }
    if (write(1, &byte, 1) != 1)
        return SETUP_FAILED;
    do
        got = read(0, &byte, 1);
    while (got > 0 || (got < 0 && errno == EINTR));
    return got == 0 ? 0 : SETUP_FAILED;
}

/* The descriptor sources in the order jail_launcher.spawn placed them: the 'm' steps',
 * then the 'r' steps', from ``next`` on; the number after the last. */
static int check_sources(const struct mount_step *steps, size_t count, int next)
{
    for (size_t i = 0; i < count; i++)
        if ((steps[i].bits & STEP_SOURCE_FD) && steps[i].source_fd != next++)
            fail("read the jail plan", EINVAL, "a bind's source descriptor is out of order");
    return next;
}

int main(int argc, char **argv)
{
    static struct plan plan;
    const char *why = "";
    sigset_t all;
    int last;
    if (argc == 2 && strcmp(argv[1], "userns") == 0)
        return hold_user_namespace();
    expected_parent = getppid(); /* 0 when this is pid 1 already (PLAN_DIRECT): the pipe tells then */
    if (signal(SIGPIPE, SIG_IGN) == SIG_ERR) /* a helper gone: report writes fail with EPIPE, quietly */
        fail_errno("jail child", "signal(SIGPIPE)");
    /* Every signal waits until the init's loop takes it (the helper's END_SIGNAL may come
     * before the command is spawned); the helper spawned us so already, this makes sure.
     * The command starts with an empty mask. */
    sigfillset(&all);
    if (sigprocmask(SIG_BLOCK, &all, NULL) < 0)
        fail_errno("jail child", "sigprocmask");
    errno = 0;
    if (plan_read(FD_PLAN, &plan, &why) < 0)
        fail("read the jail plan", errno ? errno : EINVAL, why);
    close(FD_PLAN);
    /* Not passed unless the option says so: EBADF then, nothing to close. */
    if (!(plan.options & PLAN_NET))
        close(FD_NET);
    if (!(plan.options & PLAN_ROOT))
        close(FD_ROOT);
    if (!(plan.options & PLAN_LAUNCH))
        close(FD_LAUNCH);
    /* The bind sources passed as descriptors come right after the tasks files (jail.h). */
    last = check_sources(plan.steps, plan.nsteps, FD_CGROUPS + (int)plan.cgroups);
    last = check_sources(plan.root_steps, plan.nroot_steps, last);
    /* The notifying filter's socket comes after them (jail_launcher.spawn). */
    if (plan.notify != NULL && plan.notify_fd != (uint32_t)last++)
        fail("read the jail plan", EINVAL, "the notifying filter's socket is out of order");
    /* Every descriptor past ours: nothing of the helper's may reach the command. */
    if (syscall(SYS_close_range, last, ~0U, 0) < 0)
        fail_errno("jail child", "close_range");
    /* Ours stay open until used, but none may reach the command (dup2 cleared close-on-exec). */
    for (int fd = FD_REPORT; fd < last; fd++)
        if (fd != FD_PLAN && fcntl(fd, F_SETFD, FD_CLOEXEC) < 0 && errno != EBADF)
            fail_errno("jail child", "fcntl(F_SETFD)");
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) /* the helper's thread waits for us */
        fail_errno("jail child", "prctl(PR_SET_PDEATHSIG)");
    require_parent("jail child");
    enter_cgroups(&plan);
    if (!(plan.options & PLAN_DIRECT))
        fork_init();
    jail_init(&plan);
}
