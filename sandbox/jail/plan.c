/* Reading the plan the helper wrote (format: jail.h).  Trusted input, checked anyway:
 * a malformed plan is a bug in the helper, and it must end in an "E" report, never in
 * a jail built from half a plan. */
#include "jail.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const unsigned char MAGIC[8] = PLAN_MAGIC;

/* A string record: NUL-terminated within its bound, with no NUL before its end. */
static const char *text(const char *payload, uint32_t length, uint32_t bound)
{
    if (length == 0 || length > bound || payload[length - 1] != '\0'
        || memchr(payload, '\0', length) != payload + length - 1)
        return NULL;
    return payload;
}

/* The next NUL-terminated string of a mount step record within its bound, or NULL. */
static const char *next_string(const char **cursor, const char *end, size_t bound)
{
    const char *start = *cursor;
    size_t left = start < end ? (size_t)(end - start) : 0;
    const char *nul = memchr(start, '\0', left < bound ? left : bound);
    if (nul == NULL)
        return NULL;
    *cursor = nul + 1;
    return start;
}

/* A descriptor's decimal number, every character of it, within the range a plan can pass
 * (the order is checked by the launcher, which knows how many came before); -1 if not. */
static int descriptor(const char *digits)
{
    char *end;
    long number;
    int saved = errno, overflow;
    if (*digits < '0' || *digits > '9')
        return -1;
    errno = 0;
    number = strtol(digits, &end, 10);
    overflow = errno != 0;
    errno = saved; /* the plan's refusal reports EINVAL, not strtol's ERANGE */
    if (overflow || *end != '\0' || number < FD_CGROUPS || number > FD_CGROUPS + MAX_CGROUPS + 2 * MAX_STEPS)
        return -1;
    return (int)number;
}

static int read_step(struct mount_step *steps, size_t *count, const char *payload, uint32_t length,
                     const char **why)
{
    struct mount_step *step;
    const char *cursor = payload + 12, *end = payload + length;
    uint32_t known = STEP_SOURCE_IS_FILE | STEP_NOFOLLOW | STEP_SOURCE_FD;
    if (*count >= MAX_STEPS || length < 12) {
        *why = *count >= MAX_STEPS ? "too many mount steps" : "a mount step record is too short";
        return -1;
    }
    step = &steps[*count];
    memcpy(&step->action, payload, 4);
    memcpy(&step->attrs, payload + 4, 4);
    memcpy(&step->bits, payload + 8, 4);
    step->target = next_string(&cursor, end, MAX_PATH);
    step->source = step->target == NULL ? NULL : next_string(&cursor, end, MAX_PATH);
    step->data = step->source == NULL ? NULL : next_string(&cursor, end, MAX_PATH);
    step->name = step->data == NULL ? NULL : next_string(&cursor, end, MAX_STEP_NAME);
    if (step->name == NULL || cursor != end) {
        *why = "a mount step is not four strings within their bounds (MAX_PATH, MAX_STEP_NAME)";
        return -1;
    }
    if (step->action < STEP_ACTION_MIN || step->action > STEP_ACTION_MAX || (step->bits & ~known) != 0) {
        *why = "a mount step has an unknown action or bit (a launcher from another ccw version?)";
        return -1;
    }
    step->source_fd = (step->bits & STEP_SOURCE_FD) ? descriptor(step->source) : -1;
    if ((step->bits & STEP_SOURCE_FD) && step->source_fd < 0) {
        *why = "a mount step's source descriptor is not a number in range";
        return -1;
    }
    (*count)++;
    return 0;
}

static int read_options(struct plan *plan, const char *payload, uint32_t length, const char **why)
{
    uint32_t words[9];
    if (length != sizeof words) {
        *why = "the options record is not nine words";
        return -1;
    }
    memcpy(words, payload, sizeof words);
    plan->flags = words[0];
    plan->options = words[1];
    plan->uid = words[2];
    plan->gid = words[3];
    plan->last_cap = words[4];
    plan->end_signal = words[5];
    plan->cgroups = words[6];
    plan->keep_caps = (uint64_t)words[7] | (uint64_t)words[8] << 32;
    if (plan->cgroups > MAX_CGROUPS || plan->last_cap >= 64 || plan->end_signal == 0 || plan->end_signal > 64) {
        *why = "the options record is out of bounds (cgroups, last_cap or the END signal)";
        return -1;
    }
    return 0;
}

/* The records that may come once; a second is a helper's bug, not a choice to make here. */
static int once(char tag, unsigned *seen, const char **why)
{
    static const char single[] = "Ohctfuk";
    const char *at = tag != '\0' ? strchr(single, tag) : NULL;
    unsigned bit = at != NULL ? 1u << (at - single) : 0;
    if (*seen & bit) {
        *why = "a record that comes once comes twice";
        return -1;
    }
    *seen |= bit;
    return 0;
}

/* One record into the plan; argv and env go to their arrays at their counts so far.
 * 1: go on, 0: the end record, -1: refused (why says which record and how). */
static int read_record(struct plan *plan, char tag, const char *payload, uint32_t length,
                       size_t *argc, size_t *envc, const char **why)
{
    uint32_t bound = tag == 'h' ? MAX_HOSTNAME : tag == 'c' ? MAX_PATH : MAX_ARG;
    const char *string = (tag == 'h' || tag == 'c' || tag == 'a' || tag == 'e') ? text(payload, length, bound) : payload;
    if (string == NULL) {
        *why = "a string record is not one NUL-terminated string within its bound (MAX_HOSTNAME, MAX_PATH, MAX_ARG)";
        return -1;
    }
    switch (tag) {
    case 'O': return read_options(plan, payload, length, why) < 0 ? -1 : 1;
    case 'h': plan->hostname = string; return 1;
    case 'c': plan->cwd = string; return 1;
    case 't':
        if (length == 0 || length > MAX_TIMENS) {
            *why = "the time namespace offsets are empty or longer than MAX_TIMENS";
            return -1;
        }
        plan->timens = payload;
        plan->timens_len = length;
        return 1;
    case 'f':
        if (length == 0 || length % 8 != 0 || length / 8 > MAX_FILTER_INSNS) {
            *why = "the seccomp program is not a whole number of instructions, at most MAX_FILTER_INSNS";
            return -1;
        }
        plan->seccomp = payload;
        plan->seccomp_len = length;
        return 1;
    case 'u': /* the filter's notifying form: the socket's descriptor (u32), then its program */
        if (length < 4 + 8 || (length - 4) % 8 != 0 || (length - 4) / 8 > MAX_FILTER_INSNS) {
            *why = "the notifying seccomp record is not a descriptor and a whole number of instructions";
            return -1;
        }
        memcpy(&plan->notify_fd, payload, 4);
        plan->notify = payload + 4;
        plan->notify_len = length - 4;
        return 1;
    case 'k':
        if (length != NOTIFY_KEY) {
            *why = "the run's key is not NOTIFY_KEY bytes";
            return -1;
        }
        plan->notify_key = payload;
        return 1;
    case 'a': if (plan->argv) plan->argv[*argc] = (char *)string; (*argc)++; return 1;
    case 'e': if (plan->envp) plan->envp[*envc] = (char *)string; (*envc)++; return 1;
    case 'm': return plan->argv == NULL ? 1 : (read_step(plan->steps, &plan->nsteps, payload, length, why) < 0 ? -1 : 1);
    case 'r':
        return plan->argv == NULL ? 1 : (read_step(plan->root_steps, &plan->nroot_steps, payload, length, why) < 0 ? -1 : 1);
    case 'Z':
        if (length != 0) {
            *why = "the end record is not empty";
            return -1;
        }
        return 0;
    default:
        *why = "unknown record (a launcher from another ccw version?)";
        return -1;
    }
}

/* Walk the records once (count, check) or twice (fill the arrays). */
static int walk(struct plan *plan, const char *buffer, size_t size, size_t *argc, size_t *envc, const char **why)
{
    size_t offset = sizeof MAGIC;
    unsigned seen = 0;
    *argc = *envc = 0;
    plan->nsteps = plan->nroot_steps = 0;
    while (offset + 5 <= size) {
        char tag = buffer[offset];
        uint32_t length;
        int done;
        memcpy(&length, buffer + offset + 1, 4);
        offset += 5;
        if (length > size - offset) {
            *why = "a record runs past the end of the plan";
            return -1;
        }
        if (once(tag, &seen, why) < 0)
            return -1;
        done = read_record(plan, tag, buffer + offset, length, argc, envc, why);
        if (done < 0)
            return -1;
        offset += length;
        if (done == 0) {
            if (offset != size || !(seen & 1) || plan->hostname == NULL || plan->cwd == NULL || *argc == 0) {
                *why = "the plan lacks options, hostname, cwd or argv, or has bytes past its end";
                return -1;
            }
            return 0;
        }
    }
    *why = "the plan was cut short (no end record)";
    return -1;
}

int plan_read(int fd, struct plan *plan, const char **why)
{
    struct stat info;
    char *buffer;
    size_t size, got = 0, argc, envc;
    memset(plan, 0, sizeof *plan);
    *why = "cannot read the plan's descriptor";
    if (fstat(fd, &info) < 0)
        return -1;
    if (info.st_size < (off_t)sizeof MAGIC || (uint64_t)info.st_size > PLAN_MAX_BYTES) {
        *why = "the plan's size is out of bounds";
        errno = EINVAL;
        return -1;
    }
    size = (size_t)info.st_size;
    buffer = malloc(size); /* the one allocation of the plan's bytes: the plan keeps pointing into it */
    if (buffer == NULL) {
        *why = "no memory for the plan";
        errno = ENOMEM;
        return -1;
    }
    plan->bytes = buffer;
    while (got < size) {
        ssize_t n = pread(fd, buffer + got, size - got, (off_t)got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            *why = "the plan is shorter than its descriptor says";
            errno = n < 0 ? errno : EINVAL;
            return -1;
        }
        got += (size_t)n;
    }
    errno = EINVAL;
    if (memcmp(buffer, MAGIC, sizeof MAGIC) != 0) {
        *why = "the plan's magic is not this launcher's: it was built from another sandbox/jail_interface.py "
               "(rebuild it: ./dev setup, or python setup.py launcher)";
        return -1;
    }
    if (walk(plan, buffer, size, &argc, &envc, why) < 0)
        return -1;
    plan->argv = calloc(argc + 1, sizeof *plan->argv);
    plan->envp = calloc(envc + 1, sizeof *plan->envp);
    if (plan->argv == NULL || plan->envp == NULL) {
        errno = ENOMEM;
        *why = "no memory for argv and env";
        return -1;
    }
    return walk(plan, buffer, size, &argc, &envc, why);
}
