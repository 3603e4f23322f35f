/* The capsule's side of a connection: a spare socket of the capsule's network namespace
 * from the pool, connected here; or, with none (or one refused), the front end's way.
 *
 * The pool is refilled ahead of need, in one message per refill (up to FDS_PER_MESSAGE
 * descriptors; the front end makes it one helper call): each refill is a round trip
 * through the front end and the helper, some milliseconds of Python CPU on a machine
 * whose cores the client and the server also need, so refilling a few sockets at a time
 * cost fresh connections more than the rest of their path here did (issue 36).  What a
 * spare needs but its connect (non-blocking, its family checked) is done as it arrives,
 * off the connection's path. */
#include "forward.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

void ask_front_end(struct conn *conn)
{
    conn->state = WAITING;
    tellf(MSG_CONNECT, "%llu %s %d", (unsigned long long)conn->id, conn->peer, conn->peer_port);
}

/* Ask for the pool's room once it is half empty: the other half covers the round trip. */
void refill(void)
{
    int target = G.pool_size < MAX_SPARES ? G.pool_size : MAX_SPARES;
    if (target > 0 && !G.wanting && G.nspares <= target / 2) {
        G.wanting = 1;
        tellf(MSG_WANT, "%d %d", target - G.nspares, G.family == AF_INET6 ? 6 : 4);
    }
}

int domain_of(int fd)
{
    int domain = -1;
    socklen_t length = sizeof domain;
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &length) < 0)
        return -1;
    return domain;
}

/* A capsule side's TCP_NODELAY, best effort as any relay's: set before it connects (it
 * carries over), so a spare's costs no call on its connection's path. */
void no_delay(int fd)
{
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &(int){1}, sizeof(int));
}

/* A batch of spares: kept if there is room, they are of the pool's family and they can be
 * made non-blocking (the helper makes them so already: one F_GETFL says it). */
void take_spares(const int *fds, int nfds)
{
    G.wanting = 0;
    for (int i = 0; i < nfds; i++) {
        int flags = fcntl(fds[i], F_GETFL);
        if (G.nspares < MAX_SPARES && domain_of(fds[i]) == G.family && flags >= 0
            && (flags & O_NONBLOCK || fcntl(fds[i], F_SETFL, flags | O_NONBLOCK) == 0)) {
            no_delay(fds[i]);
            G.spares[G.nspares++] = fds[i];
        } else {
            close(fds[i]);  /* the pool is full, or they are of the family it left */
        }
    }
}

/* The server answered the helper's connect on the other family: the pool follows it. */
void follow_family(int domain)
{
    if (domain != AF_INET && domain != AF_INET6)
        return;
    G.family = domain;
    while (G.nspares > 0)
        close(G.spares[--G.nspares]);
    G.wanting = 0;  /* a batch of the old family still on its way is dropped as it comes */
    refill();
}

/* The spare in end[1] has finished connecting: relay, or (refused there) the front end's way. */
static void settle(struct conn *conn)
{
    int error = 0;
    socklen_t length = sizeof error;
    int spare = conn->end[1].fd;
    if (getsockopt(spare, SOL_SOCKET, SO_ERROR, &error, &length) < 0)
        error = errno;
    if (conn->watched[1] && epoll_ctl(G.epoll, EPOLL_CTL_DEL, spare, NULL) < 0)
        die("epoll_ctl");
    conn->watched[1] = 0;
    conn->end[1].fd = -1;
    if (error == 0) {
        start_relay(conn, spare);
        return;
    }
    close(spare);
    conn->spare_refused = 1;
    ask_front_end(conn);
}

/* A spare connected to the capsule's port: at once, or (loopback's handshake is usually
 * over by the time connect returns EINPROGRESS) after a poll that does not wait, or later
 * (EPOLLOUT on it); or refused there: then the front end's way. */
void connect_spare(struct conn *conn)
{
    struct sockaddr_in there4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)G.port),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct sockaddr_in6 there6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)G.port),
                                  .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    int v6 = G.family == AF_INET6;  /* the pool holds the one family (take_spares) */
    int spare;
    if (G.nspares == 0) {
        ask_front_end(conn);
        return;
    }
    spare = G.spares[--G.nspares];
    if (connect(spare, v6 ? (struct sockaddr *)&there6 : (struct sockaddr *)&there4,
                v6 ? sizeof there6 : sizeof there4) == 0) {
        start_relay(conn, spare);
    } else if (errno == EINPROGRESS) {
        struct pollfd now = {.fd = spare, .events = POLLOUT};
        conn->end[1].fd = spare;
        int polled = poll(&now, 1, 0);
        if (polled == 1 && now.revents == POLLOUT) {
            start_relay(conn, spare);  /* writable with no error or hang-up: connected, nothing to ask */
        } else if (polled == 1) {
            settle(conn);
        } else {
            conn->state = CONNECTING;
            watch(&conn->end[1], EPOLLOUT, EPOLL_CTL_ADD);
        }
    } else {
        close(spare);
        conn->spare_refused = 1;
        ask_front_end(conn);
    }
}

void connected_later(struct conn *conn)
{
    settle(conn);
}
