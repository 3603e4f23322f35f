/* The control socket: what is told to the front end (never waited for: a message it cannot
 * take at once is dropped and counted) and what is taken from it. */
#include "forward.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void tell(const char *text, size_t length)
{
    if (send(G.control, text, length, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
        if (errno == EAGAIN || errno == ENOBUFS)
            G.dropped++;
        else if (errno == EPIPE || errno == ECONNRESET)
            exit(0);  /* the front end has gone: so has the port */
    }
}

void tellf(char code, const char *format, ...)
{
    char text[256];
    va_list args;
    int length;
    text[0] = code;
    va_start(args, format);
    length = vsnprintf(text + 1, sizeof text - 1, format, args);
    va_end(args);
    if (length < 0)
        return;
    tell(text, 1 + ((size_t)length < sizeof text - 1 ? (size_t)length : sizeof text - 2));
}

static struct conn *waiting(uint64_t id)
{
    for (struct conn *conn = G.waiting_head; conn; conn = conn->next)
        if (conn->id == id && conn->state == WAITING)
            return conn;
    return NULL;
}

/* One message, if one is there: 1, or 0 (none waiting). */
int take_message(void)
{
    char text[64];
    union { struct cmsghdr header; char bytes[CMSG_SPACE(sizeof(int) * FDS_PER_MESSAGE)]; } control;
    struct iovec iov = {text, sizeof text - 1};
    struct msghdr message = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = &control,
                             .msg_controllen = sizeof control};
    int fds[FDS_PER_MESSAGE], nfds = 0;
    ssize_t got = recvmsg(G.control, &message, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (got == 0)
        exit(0);  /* the front end closed the port, or died */
    if (got < 0) {
        if (errno == EAGAIN || errno == EINTR)
            return 0;
        exit(errno == ECONNRESET ? 0 : 1);
    }
    for (struct cmsghdr *header = CMSG_FIRSTHDR(&message); header; header = CMSG_NXTHDR(&message, header))
        if (header->cmsg_level == SOL_SOCKET && header->cmsg_type == SCM_RIGHTS) {
            int count = (int)((header->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < count && nfds < FDS_PER_MESSAGE; i++)
                memcpy(&fds[nfds++], CMSG_DATA(header) + i * sizeof(int), sizeof(int));
        }
    text[got] = '\0';
    switch (got > 0 ? text[0] : 0) {
    case MSG_SPARES:
        take_spares(fds, nfds);
        return 1;
    case MSG_CONNECTED: {
        struct conn *conn = waiting(strtoull(text + 1, NULL, 10));
        if (nfds == 1 && conn) {
            int domain = domain_of(fds[0]);
            if (conn->spare_refused && domain != G.family)
                follow_family(domain);
            no_delay(fds[0]);
            start_relay(conn, fds[0]);
            return 1;
        }
        break;  /* timed out meanwhile: the socket is closed below */
    }
    case MSG_FAILED: {
        struct conn *conn = waiting(strtoull(text + 1, NULL, 10));
        if (conn) {
            G.errors++;  /* the front end reports why; here it only ends */
            finish(conn);
        }
        break;
    }
    case MSG_STATS:
        tellf(MSG_COUNTS, "%llu %llu %llu %d %llu", (unsigned long long)G.accepted,
              (unsigned long long)G.refused, (unsigned long long)G.errors, G.open,
              (unsigned long long)G.dropped);
        break;
    default:
        fprintf(stderr, "ccw-forward: an unknown message from the front end (%zd bytes)\n", got);
    }
    for (int i = 0; i < nfds; i++)
        close(fds[i]);
    return 1;
}
