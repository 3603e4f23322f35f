/* The jail plan's parser (sandbox/jail/plan.c) alone, for tests: built with ASan and UBSan
 * (tests/support/jail_parser.py), it reads plans from stdin, each a u32 length (native
 * order) and the plan's bytes, hands each to plan_read on a memfd as ccw-jail gets it,
 * and prints one line per plan: "ok" and what was read, or "refused" and the reason.
 *
 * A plan the parser accepts must keep every promise jail.h makes of it (each string
 * within its bound, argv and env NULL-terminated, known step actions and bits, source
 * descriptors in range): a broken promise aborts, as a sanitizer's finding does, and the
 * test fails. */
#define _GNU_SOURCE
#include "jail.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static void promise(int kept, const char *what)
{
    if (!kept) {
        fprintf(stderr, "broken promise: %s\n", what);
        abort();
    }
}

static void check_steps(const struct mount_step *steps, size_t count)
{
    promise(count <= MAX_STEPS, "step count");
    for (size_t i = 0; i < count; i++) {
        const struct mount_step *step = &steps[i];
        promise(step->action >= STEP_ACTION_MIN && step->action <= STEP_ACTION_MAX, "step action");
        promise((step->bits & ~(uint32_t)(STEP_SOURCE_IS_FILE | STEP_NOFOLLOW | STEP_SOURCE_FD)) == 0, "step bits");
        promise(strlen(step->target) < MAX_PATH && strlen(step->source) < MAX_PATH && strlen(step->data) < MAX_PATH,
                "step string bounds");
        promise(strlen(step->name) < MAX_STEP_NAME, "step name bound");
        promise((step->bits & STEP_SOURCE_FD) ? step->source_fd >= FD_CGROUPS : step->source_fd == -1, "source fd");
    }
}

static void check(const struct plan *plan)
{
    size_t argc = 0, envc = 0;
    promise(plan->hostname != NULL && strlen(plan->hostname) < MAX_HOSTNAME, "hostname");
    promise(plan->cwd != NULL && strlen(plan->cwd) < MAX_PATH, "cwd");
    promise(plan->cgroups <= MAX_CGROUPS && plan->end_signal >= 1 && plan->end_signal <= 64, "options");
    for (; plan->argv[argc] != NULL; argc++)
        promise(strlen(plan->argv[argc]) < MAX_ARG, "argv bound");
    for (; plan->envp[envc] != NULL; envc++)
        promise(strlen(plan->envp[envc]) < MAX_ARG, "env bound");
    promise(argc >= 1, "argv");
    promise(plan->seccomp == NULL || (plan->seccomp_len % 8 == 0 && plan->seccomp_len / 8 <= MAX_FILTER_INSNS), "filter");
    promise(plan->timens == NULL || (plan->timens_len > 0 && plan->timens_len <= MAX_TIMENS), "timens");
    check_steps(plan->steps, plan->nsteps);
    check_steps(plan->root_steps, plan->nroot_steps);
    printf("ok options=%u uid=%u gid=%u cgroups=%u argc=%zu envc=%zu steps=%zu root_steps=%zu", plan->options,
           plan->uid, plan->gid, plan->cgroups, argc, envc, plan->nsteps, plan->nroot_steps);
    for (size_t i = 0; i < plan->nsteps; i++)
        printf(" %u:%u:%u", plan->steps[i].action, plan->steps[i].attrs, plan->steps[i].bits);
    printf("\n");
}

int main(void)
{
    static struct plan plan;
    uint32_t length;
    while (fread(&length, sizeof length, 1, stdin) == 1) {
        char *bytes = malloc(length ? length : 1);
        const char *why = "";
        int fd = memfd_create("plan", MFD_CLOEXEC);
        promise(bytes != NULL && fd >= 0, "the harness's own memory and memfd");
        promise(fread(bytes, 1, length, stdin) == length, "a whole input");
        promise(write(fd, bytes, length) == (ssize_t)length, "the memfd written");
        if (plan_read(fd, &plan, &why) == 0)
            check(&plan);
        else
            printf("refused %s\n", why);
        free(plan.bytes);
        free(plan.argv);
        free(plan.envp);
        free(bytes);
        close(fd);
    }
    return 0;
}
