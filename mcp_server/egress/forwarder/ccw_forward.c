/* ccw-forward: one forwarded port's accept loop and relay, run by the front end
 * (mcp_server/egress/forward.py) for each port that capsule_port opens.
 *
 * Why C (DESIGN §8: "no other C without a measured reason").  In the front end each
 * connection to a forwarded port cost some 1.5 ms of trio's CPU before its first byte
 * (the accept, the owner check, the connect, two tasks), and each request on a kept
 * connection two trio wake-ups per direction: ``bench/run.py services`` measured 0.24-0.31x
 * the direct rate for a dev server's fresh connections and 0.48-0.53x for a kept one.  A
 * relay is a few syscalls per event; this program makes exactly those, and the front end
 * (a trio process that also serves every tool) keeps only what needs it: the helper's
 * sockets, events, counts.  Nothing here decides what passes but the rule it is given:
 * the owner's uid, checked per connection before a byte is read.
 *
 * What it is given (argv names every descriptor, so no number is shared with Python):
 *
 *   --listen FD      the listening socket on the host's loopback (made by the front end)
 *   --control FD     a SOCK_SEQPACKET to the front end; its end is this program's end
 *   --owner UID      the only uid whose sockets may pass
 *   --port PORT      the capsule's port, on the capsule's loopback (127.0.0.1)
 *   --pool N         spare sockets to keep (the front end asks the helper for them)
 *   --max-open N     connections at once; past it one is closed and reported
 *   --connect-timeout-ms MS   for a connection's capsule side, however it is made
 *
 * Sockets of the capsule's side come from the front end, which has them from the helper:
 * unconnected sockets of the capsule's network namespace.  A socket's connect() acts in
 * the namespace it was made in, so this program never enters one and needs no privilege:
 * it runs as the front end's user.
 *
 * The control protocol: each datagram is a code byte, then ASCII fields split by single
 * spaces.  ``ccw-forward --protocol`` prints the codes ("message NAME CODE" lines) and the
 * limits the front end must keep to ("limit NAME VALUE"), and the front end reads them
 * from there, so this file is their only source.
 *
 *   to here:   spares (descriptors attached), connected ID (one attached), failed ID, stats
 *   from here: want N FAMILY (4 or 6), connect ID ADDR PORT, refused UID ADDR PORT,
 *              error KIND ADDR PORT, counts ACCEPTED REFUSED ERRORS OPEN DROPPED
 *
 * ``connect`` asks the front end for a capsule socket the helper connects (none spare, or
 * the spare's connect refused).  The spares are of one family, IPv4 at first.  A server
 * that listens on ::1 alone (``localhost`` resolved to IPv6, as Node's dev servers do)
 * refuses them; the helper's connect then reaches it on ::1, and that socket's family
 * becomes the pool's: the IPv4 spares are dropped and IPv6 ones asked for, so only the
 * first connection pays the round trip.  The same the other way.  Every
 * connection waiting for its capsule side has the one deadline; past it, it is closed and
 * reported as ``error timeout``.  A message the front end cannot take at once (its socket
 * buffer full) is dropped and counted, never waited for: a busy front end must not stall
 * relays.  A dropped ``connect`` ends at its deadline like any other.
 *
 * The relay: each direction through its own pipe, with splice(2), so bytes are never
 * copied to this process; a pipe holds at most its 64 KiB, and a side is not read while
 * its pipe has bytes the other side has not taken (back-pressure: a slow reader slows
 * the writer, and nothing queues here beyond the pipe).  An EOF is passed on as a
 * half-close (shutdown SHUT_WR) once its pipe is empty; a connection ends when both
 * directions have, or at once on an error of either side.  The accepted sockets inherit
 * the listener's congestion control, which the front end sets (splice.unpaced).
 *
 * Lifetime: the control socket is the lifeline.  Its end (the front end closing the port,
 * or dying) ends this program, and the kernel closes every connection with it.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum message {
    MSG_SPARES = 'S', MSG_CONNECTED = 'C', MSG_FAILED = 'F', MSG_STATS = '?',
    MSG_WANT = 'W', MSG_CONNECT = 'R', MSG_REFUSED = 'X', MSG_ERROR = 'E', MSG_COUNTS = 'N',
};

static const struct { const char *name; char code; } PROTOCOL[] = {
    {"spares", MSG_SPARES}, {"connected", MSG_CONNECTED}, {"failed", MSG_FAILED}, {"stats", MSG_STATS},
    {"want", MSG_WANT}, {"connect", MSG_CONNECT}, {"refused", MSG_REFUSED}, {"error", MSG_ERROR},
    {"counts", MSG_COUNTS},
};

#define MAX_SPARES 64        /* the pool's ceiling, whatever --pool says */
#define FDS_PER_MESSAGE 16   /* descriptors in one spares message */
#define CHUNK (1 << 16)      /* one splice: a default pipe's capacity */

enum state { WAITING, CONNECTING, RELAYING, DONE };

struct conn;
struct end { struct conn *conn; int fd; int side; };
struct conn {
    struct end end[2];          /* 0 the client's (host), 1 the capsule's */
    int pipe[2][2];             /* pipe[d]: bytes read from end d, for end 1 - d */
    size_t held[2];             /* bytes in pipe[d] */
    int eof[2], shut[2];        /* end d sent its EOF; end d was shut for writing */
    int watched[2];             /* end d is in the epoll set */
    uint32_t interest[2];       /* and for which events: changed only when it must be */
    enum state state;
    int spare_refused;          /* a spare's connect was refused: the helper's connect may find the family */
    uint64_t id;
    struct timespec deadline;
    char peer[INET_ADDRSTRLEN];
    int peer_port;
    struct conn *prev, *next;   /* waiting for their capsule side, oldest first; or ended, to free */
};

static struct {
    int listen, control, diag, epoll;
    uid_t owner;
    int port, pool_size, max_open, timeout_ms;
    int spares[MAX_SPARES], nspares, wanting;
    int family;                 /* the spares' family: AF_INET, or AF_INET6 once a server was there alone */
    int open;
    uint64_t next_id, accepted, refused, errors, dropped;
    struct conn *waiting_head, *waiting_tail;
    struct conn *ended;         /* freed after each batch of events, which may still name them */
    struct sockaddr_in local;   /* the listener's own address: every client's other end */
    struct timespec resume;     /* accepting paused until then (tv_sec 0: not paused) */
} G;

#define ACCEPT_PAUSE_MS 100     /* out of descriptors or memory: accept again after this */
#define FDS_PER_CONNECTION 6    /* two sockets, two pipes */
#define RESERVED_FDS (32 + MAX_SPARES + FDS_PER_MESSAGE)  /* the program's own, the pool, a message's */

static char LISTENER_TAG, CONTROL_TAG;  /* epoll data for the two descriptors that are no connection's */

static void die(const char *what)
{
    fprintf(stderr, "ccw-forward: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void tell(const char *text, size_t length)
{
    if (send(G.control, text, length, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
        if (errno == EAGAIN || errno == ENOBUFS)
            G.dropped++;
        else if (errno == EPIPE || errno == ECONNRESET)
            exit(0);  /* the front end has gone: so has the port */
    }
}

static void tellf(char code, const char *format, ...) __attribute__((format(printf, 2, 3)));
static void tellf(char code, const char *format, ...)
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

/* --- the owner check ------------------------------------------------------------------ */

/* The uid that owns the client's socket, or -1: nobody holds it any more (ENOENT, or a
 * reply with inode 0: a closed socket's remains, which report uid 0 whoever owned them),
 * or the kernel said something else.  egress/peer.py's essay says why each check. */
static long owner_of(const struct sockaddr_in *client)
{
    struct { struct nlmsghdr header; struct inet_diag_req_v2 req; } ask;
    union { struct nlmsghdr header; char bytes[8192]; } reply;
    struct nlmsghdr *message;
    ssize_t got;
    memset(&ask, 0, sizeof ask);
    ask.header.nlmsg_len = sizeof ask;
    ask.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    ask.header.nlmsg_flags = NLM_F_REQUEST;
    ask.header.nlmsg_seq = (uint32_t)++G.next_id;
    ask.req.sdiag_family = AF_INET;
    ask.req.sdiag_protocol = IPPROTO_TCP;
    ask.req.idiag_states = 0xffffffffu;
    ask.req.id.idiag_sport = client->sin_port;          /* the client's own end ... */
    ask.req.id.idiag_dport = G.local.sin_port;          /* ... and its other end: us */
    ask.req.id.idiag_src[0] = client->sin_addr.s_addr;
    ask.req.id.idiag_dst[0] = G.local.sin_addr.s_addr;
    ask.req.id.idiag_cookie[0] = ask.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
    if (send(G.diag, &ask, sizeof ask, 0) < 0)
        return -1;
    got = recv(G.diag, &reply, sizeof reply, MSG_DONTWAIT);  /* queued inside send */
    if (got < 0)
        return -1;
    for (message = &reply.header; NLMSG_OK(message, (size_t)got); message = NLMSG_NEXT(message, got)) {
        const struct inet_diag_msg *found = NLMSG_DATA(message);
        if (message->nlmsg_type != SOCK_DIAG_BY_FAMILY || message->nlmsg_len < NLMSG_LENGTH(sizeof *found))
            continue;
        /* Not in the established hash, the kernel tries the listeners by one end alone:
         * only a reply naming both ends is the client's. */
        if (found->idiag_family == AF_INET && found->id.idiag_sport == client->sin_port
            && found->id.idiag_dport == G.local.sin_port && found->id.idiag_src[0] == client->sin_addr.s_addr
            && found->id.idiag_dst[0] == G.local.sin_addr.s_addr && found->idiag_inode != 0)
            return (long)found->idiag_uid;
    }
    return -1;
}

/* --- connections ---------------------------------------------------------------------- */

static void watch(struct end *end, uint32_t events, int op)
{
    struct epoll_event event = {.events = events, .data.ptr = end};
    if (epoll_ctl(G.epoll, op, end->fd, &event) < 0)
        die("epoll_ctl");
    end->conn->watched[end->side] = op != EPOLL_CTL_DEL;
    end->conn->interest[end->side] = events;
}

static void unlink_waiting(struct conn *conn)
{
    if (conn->state == RELAYING || conn->state == DONE)
        return;
    if (conn->prev) conn->prev->next = conn->next; else G.waiting_head = conn->next;
    if (conn->next) conn->next->prev = conn->prev; else G.waiting_tail = conn->prev;
    conn->prev = conn->next = NULL;
}

static void finish(struct conn *conn)
{
    unlink_waiting(conn);
    for (int side = 0; side < 2; side++) {
        if (conn->end[side].fd >= 0)
            close(conn->end[side].fd);  /* also leaves the epoll set */
        for (int i = 0; i < 2; i++)
            if (conn->pipe[side][i] >= 0)
                close(conn->pipe[side][i]);
    }
    G.open--;
    conn->state = DONE;
    conn->next = G.ended;
    G.ended = conn;
}

static void fail(struct conn *conn, const char *kind)
{
    G.errors++;
    tellf(MSG_ERROR, "%s %s %d", kind, conn->peer, conn->peer_port);
    finish(conn);
}

static void ask_front_end(struct conn *conn)
{
    conn->state = WAITING;
    tellf(MSG_CONNECT, "%llu %s %d", (unsigned long long)conn->id, conn->peer, conn->peer_port);
}

static void refill(void)
{
    int target = G.pool_size < MAX_SPARES ? G.pool_size : MAX_SPARES;
    if (target > 0 && !G.wanting && G.nspares <= target / 2) {
        G.wanting = 1;
        tellf(MSG_WANT, "%d %d", target - G.nspares, G.family == AF_INET6 ? 6 : 4);
    }
}

static int domain_of(int fd)
{
    int domain = -1;
    socklen_t length = sizeof domain;
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &length) < 0)
        return -1;
    return domain;
}

/* The server answered the helper's connect on the other family: the pool follows it. */
static void follow_family(int domain)
{
    if (domain != AF_INET && domain != AF_INET6)
        return;
    G.family = domain;
    while (G.nspares > 0)
        close(G.spares[--G.nspares]);
    G.wanting = 0;  /* a batch of the old family still on its way is dropped as it comes */
    refill();
}

/* Each end's interest: read it while its pipe is empty and it has not ended; wait until
 * it can be written while the other end's pipe holds bytes for it. */
static void rewatch(struct conn *conn)
{
    for (int side = 0; side < 2; side++) {
        uint32_t events = 0;
        if (conn->eof[side] && conn->shut[side]) {
            /* Done both ways (shut only follows an empty pipe): out of the set, or its
             * hang-up would be reported at every wait. */
            if (conn->watched[side])
                watch(&conn->end[side], 0, EPOLL_CTL_DEL);
            continue;
        }
        if (!conn->eof[side] && conn->held[side] == 0)
            events |= EPOLLIN;
        if (conn->held[1 - side] > 0)
            events |= EPOLLOUT;
        if (events != conn->interest[side])  /* a request on a kept connection changes none */
            watch(&conn->end[side], events, EPOLL_CTL_MOD);
    }
}

/* Move what end ``from`` has for the other end, as far as both allow: until ``from`` has
 * nothing more to read (EPOLLIN says when it has), or the other end takes no more
 * (EPOLLOUT on it resumes).  0, or -1: the connection failed. */
static int pump(struct conn *conn, int from)
{
    int to = 1 - from, full = 0;
    for (;;) {
        if (conn->held[from] == 0 && !conn->eof[from]) {
            ssize_t got = splice(conn->end[from].fd, NULL, conn->pipe[from][1], NULL, CHUNK,
                                 SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
            if (got == 0)
                conn->eof[from] = 1;
            else if (got > 0)
                conn->held[from] = (size_t)got, full = got == CHUNK;
            else if (errno == EAGAIN)
                return 0;
            else if (errno != EINTR)
                return -1;
        }
        while (conn->held[from] > 0) {
            ssize_t put = splice(conn->pipe[from][0], NULL, conn->end[to].fd, NULL, conn->held[from],
                                 SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
            if (put > 0)
                conn->held[from] -= (size_t)put;
            else if (errno == EAGAIN)
                return 0;
            else if (errno != EINTR)
                return -1;
        }
        if (conn->eof[from]) {
            if (!conn->shut[to] && shutdown(conn->end[to].fd, SHUT_WR) < 0 && errno != ENOTCONN)
                return -1;
            conn->shut[to] = 1;
            return 0;
        }
        if (!full)
            return 0;  /* a short read emptied the queue; EPOLLIN (level-triggered) says when there is more */
    }
}

/* ``events`` on end ``side``: its bytes to read (or its end), or room for the other end's. */
static void relay_ready(struct conn *conn, int side, uint32_t events)
{
    if ((events & ~EPOLLOUT && pump(conn, side) < 0) || (events & EPOLLOUT && pump(conn, 1 - side) < 0)) {
        finish(conn);  /* a reset or a broken pipe: the connection is over, not an error of the port's */
        return;
    }
    if (conn->eof[0] && conn->eof[1] && conn->held[0] == 0 && conn->held[1] == 0) {
        finish(conn);
        return;
    }
    rewatch(conn);
}

static void start_relay(struct conn *conn, int capsule)
{
    static const int one = 1;
    unlink_waiting(conn);
    conn->state = RELAYING;
    conn->end[1].fd = capsule;
    setsockopt(capsule, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  /* best effort, as any relay */
    for (int side = 0; side < 2; side++)
        if (pipe2(conn->pipe[side], O_CLOEXEC | O_NONBLOCK) < 0) {
            fail(conn, "pipe");
            return;
        }
    G.accepted++;
    watch(&conn->end[1], 0, EPOLL_CTL_ADD);
    relay_ready(conn, 0, EPOLLIN);  /* what the client sent while it waited */
}

/* A spare connected to the capsule's port: at once (loopback often answers inside
 * connect), later (EPOLLOUT on it), or refused there: then the front end's way. */
static void connect_spare(struct conn *conn, int spare)
{
    struct sockaddr_in there4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)G.port),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct sockaddr_in6 there6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)G.port),
                                  .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    int v6 = domain_of(spare) == AF_INET6;
    int flags = fcntl(spare, F_GETFL);
    if (flags < 0 || fcntl(spare, F_SETFL, flags | O_NONBLOCK) < 0) {
        close(spare);
        ask_front_end(conn);
        return;
    }
    if (connect(spare, v6 ? (struct sockaddr *)&there6 : (struct sockaddr *)&there4,
                v6 ? sizeof there6 : sizeof there4) == 0) {
        start_relay(conn, spare);
    } else if (errno == EINPROGRESS) {
        conn->state = CONNECTING;
        conn->end[1].fd = spare;
        watch(&conn->end[1], EPOLLOUT, EPOLL_CTL_ADD);
    } else {
        close(spare);
        conn->spare_refused = 1;
        ask_front_end(conn);
    }
}

static void connected_later(struct conn *conn)
{
    int error = 0;
    socklen_t length = sizeof error;
    int spare = conn->end[1].fd;
    if (getsockopt(spare, SOL_SOCKET, SO_ERROR, &error, &length) < 0)
        error = errno;
    if (error == 0) {
        if (epoll_ctl(G.epoll, EPOLL_CTL_DEL, spare, NULL) < 0)
            die("epoll_ctl");
        conn->end[1].fd = -1;
        start_relay(conn, spare);
        return;
    }
    close(spare);
    conn->end[1].fd = -1;
    conn->spare_refused = 1;
    ask_front_end(conn);
}

static struct conn *new_conn(int client, const struct sockaddr_in *from)
{
    struct conn *conn = calloc(1, sizeof *conn);
    struct timespec now;
    if (!conn)
        return NULL;
    conn->id = ++G.next_id;
    conn->end[0] = (struct end){conn, client, 0};
    conn->end[1] = (struct end){conn, -1, 1};
    for (int side = 0; side < 2; side++)
        conn->pipe[side][0] = conn->pipe[side][1] = -1;
    if (!inet_ntop(AF_INET, &from->sin_addr, conn->peer, sizeof conn->peer))
        strcpy(conn->peer, "?");
    conn->peer_port = ntohs(from->sin_port);
    clock_gettime(CLOCK_MONOTONIC, &now);
    conn->deadline.tv_sec = now.tv_sec + G.timeout_ms / 1000;
    conn->deadline.tv_nsec = now.tv_nsec + (long)(G.timeout_ms % 1000) * 1000000L;
    if (conn->deadline.tv_nsec >= 1000000000L) {
        conn->deadline.tv_sec++;
        conn->deadline.tv_nsec -= 1000000000L;
    }
    conn->prev = G.waiting_tail;  /* every new one waits for its capsule side, the latest deadline */
    if (G.waiting_tail) G.waiting_tail->next = conn; else G.waiting_head = conn;
    G.waiting_tail = conn;
    G.open++;
    return conn;
}

/* Judge a new connection before a byte is read: the owner's, under the cap, else closed. */
static void admit(int client, const struct sockaddr_in *from)
{
    static const int one = 1;
    long uid = owner_of(from);
    struct conn *conn;
    char peer[INET_ADDRSTRLEN] = "?";
    if (uid < 0 || (uid_t)uid != G.owner) {
        inet_ntop(AF_INET, &from->sin_addr, peer, sizeof peer);
        close(client);
        G.refused++;
        tellf(MSG_REFUSED, "%ld %s %d", uid, peer, ntohs(from->sin_port));
        return;
    }
    if (G.open >= G.max_open || !(conn = new_conn(client, from))) {
        inet_ntop(AF_INET, &from->sin_addr, peer, sizeof peer);
        close(client);
        G.errors++;
        tellf(MSG_ERROR, "full %s %d", peer, ntohs(from->sin_port));
        return;
    }
    setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    watch(&conn->end[0], 0, EPOLL_CTL_ADD);  /* no interest until the capsule's side is there */
    if (G.nspares > 0)
        connect_spare(conn, G.spares[--G.nspares]);
    else
        ask_front_end(conn);
    refill();
}

static void accept_all(void)
{
    for (;;) {
        struct sockaddr_in from;
        socklen_t length = sizeof from;
        int client = accept4(G.listen, (struct sockaddr *)&from, &length, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (client >= 0) {
            if (from.sin_family == AF_INET)
                admit(client, &from);
            else
                close(client);  /* the listener is 127.0.0.1: never */
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED)
            continue;
        if (errno != EAGAIN) {
            /* EMFILE and the like: the listener stays readable, so waiting on it would spin.
             * The backlog keeps the clients while it is out of the set for a moment. */
            struct epoll_event none = {.events = 0, .data.ptr = &LISTENER_TAG};
            fprintf(stderr, "ccw-forward: accept: %s; pausing %d ms\n", strerror(errno), ACCEPT_PAUSE_MS);
            if (epoll_ctl(G.epoll, EPOLL_CTL_MOD, G.listen, &none) < 0)
                die("epoll_ctl");
            clock_gettime(CLOCK_MONOTONIC, &G.resume);
            G.resume.tv_nsec += ACCEPT_PAUSE_MS * 1000000L;
            if (G.resume.tv_nsec >= 1000000000L) {
                G.resume.tv_sec++;
                G.resume.tv_nsec -= 1000000000L;
            }
        }
        return;
    }
}

/* --- the front end's messages --------------------------------------------------------- */

static struct conn *waiting(uint64_t id)
{
    for (struct conn *conn = G.waiting_head; conn; conn = conn->next)
        if (conn->id == id && conn->state == WAITING)
            return conn;
    return NULL;
}

static void take_message(void)
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
            return;
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
        G.wanting = 0;
        for (int i = 0; i < nfds; i++) {
            if (G.nspares < MAX_SPARES && domain_of(fds[i]) == G.family)
                G.spares[G.nspares++] = fds[i];
            else
                close(fds[i]);  /* the pool is full, or they are of the family it left */
        }
        return;
    case MSG_CONNECTED: {
        struct conn *conn = waiting(strtoull(text + 1, NULL, 10));
        if (nfds == 1 && conn) {
            int domain = domain_of(fds[0]);
            if (conn->spare_refused && domain != G.family)
                follow_family(domain);
            start_relay(conn, fds[0]);
            return;
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
}

/* --- the loop ------------------------------------------------------------------------- */

static int ms_until(const struct timespec *when)
{
    struct timespec now;
    long long ms;
    clock_gettime(CLOCK_MONOTONIC, &now);
    ms = (long long)(when->tv_sec - now.tv_sec) * 1000 + (when->tv_nsec - now.tv_nsec) / 1000000;
    return ms < 0 ? 0 : ms > INT_MAX ? INT_MAX : (int)ms + 1;
}

static void expire(void)
{
    while (G.waiting_head && ms_until(&G.waiting_head->deadline) == 0)
        fail(G.waiting_head, "timeout");
    if (G.resume.tv_sec && ms_until(&G.resume) == 0) {
        struct epoll_event listener = {.events = EPOLLIN, .data.ptr = &LISTENER_TAG};
        G.resume.tv_sec = 0;
        if (epoll_ctl(G.epoll, EPOLL_CTL_MOD, G.listen, &listener) < 0)
            die("epoll_ctl");
    }
}

/* epoll_wait's timeout: the next deadline of a waiting connection or of a paused accept. */
static int next_timeout(void)
{
    int timeout = G.waiting_head ? ms_until(&G.waiting_head->deadline) : -1;
    if (G.resume.tv_sec) {
        int resume = ms_until(&G.resume);
        timeout = timeout < 0 || resume < timeout ? resume : timeout;
    }
    return timeout;
}

static long number(const char *text, const char *name, long low, long high)
{
    char *end;
    long value;
    errno = 0;
    value = strtol(text, &end, 10);
    if (errno || end == text || *end || value < low || value > high) {
        fprintf(stderr, "ccw-forward: %s must be a number from %ld to %ld, not %s\n", name, low, high, text);
        exit(2);
    }
    return value;
}

static void options(int argc, char **argv)
{
    int seen = 0;
    if (argc == 2 && strcmp(argv[1], "--protocol") == 0) {
        for (size_t i = 0; i < sizeof PROTOCOL / sizeof PROTOCOL[0]; i++)
            printf("message %s %c\n", PROTOCOL[i].name, PROTOCOL[i].code);
        printf("limit fds_per_message %d\nlimit max_spares %d\n", FDS_PER_MESSAGE, MAX_SPARES);
        exit(0);
    }
    for (int i = 1; i + 1 < argc; i += 2, seen++) {
        const char *name = argv[i], *value = argv[i + 1];
        if (strcmp(name, "--listen") == 0) G.listen = (int)number(value, name, 0, INT_MAX);
        else if (strcmp(name, "--control") == 0) G.control = (int)number(value, name, 0, INT_MAX);
        else if (strcmp(name, "--owner") == 0) G.owner = (uid_t)number(value, name, 0, UINT32_MAX - 1);
        else if (strcmp(name, "--port") == 0) G.port = (int)number(value, name, 1, 65535);
        else if (strcmp(name, "--pool") == 0) G.pool_size = (int)number(value, name, 0, MAX_SPARES);
        else if (strcmp(name, "--max-open") == 0) G.max_open = (int)number(value, name, 1, 1 << 20);
        else if (strcmp(name, "--connect-timeout-ms") == 0) G.timeout_ms = (int)number(value, name, 1, 3600000);
        else {
            fprintf(stderr, "ccw-forward: unknown option %s\n", name);
            exit(2);
        }
    }
    if (seen != 7 || argc != 15) {
        fprintf(stderr, "usage: ccw-forward --listen FD --control FD --owner UID --port PORT --pool N "
                        "--max-open N --connect-timeout-ms MS (each once), or ccw-forward --protocol\n");
        exit(2);
    }
}

int main(int argc, char **argv)
{
    struct rlimit files;
    socklen_t length = sizeof G.local;
    struct epoll_event events[64];
    options(argc, argv);
    G.family = AF_INET;
    /* A write to a socket whose reader has gone is an EPIPE here, handled, not a signal. */
    if (signal(SIGPIPE, SIG_IGN) == SIG_ERR)
        die("signal");
    /* Six descriptors a connection (two sockets, two pipes): as many as the hard limit
     * allows, and no more connections than fit, so that past them a client is refused as
     * ``full`` (said to the front end) rather than accepted and cut for want of a pipe. */
    if (getrlimit(RLIMIT_NOFILE, &files) < 0)
        die("getrlimit");
    if (files.rlim_cur < files.rlim_max) {
        files.rlim_cur = files.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &files) < 0)
            die("setrlimit");
    }
    if (files.rlim_cur != RLIM_INFINITY) {
        long room = ((long)files.rlim_cur - RESERVED_FDS) / FDS_PER_CONNECTION;
        if (room < 1)
            room = 1;
        if (room < G.max_open)
            G.max_open = (int)room;
    }
    if (getsockname(G.listen, (struct sockaddr *)&G.local, &length) < 0 || G.local.sin_family != AF_INET)
        die("the listener is no IPv4 socket");
    if (fcntl(G.listen, F_SETFL, O_NONBLOCK) < 0 || fcntl(G.control, F_SETFL, O_NONBLOCK) < 0)
        die("fcntl");
    G.diag = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (G.diag < 0)
        die("a sock_diag socket");
    G.epoll = epoll_create1(EPOLL_CLOEXEC);
    if (G.epoll < 0)
        die("epoll_create1");
    {
        struct epoll_event listener = {.events = EPOLLIN, .data.ptr = &LISTENER_TAG};
        struct epoll_event control = {.events = EPOLLIN, .data.ptr = &CONTROL_TAG};
        if (epoll_ctl(G.epoll, EPOLL_CTL_ADD, G.listen, &listener) < 0
            || epoll_ctl(G.epoll, EPOLL_CTL_ADD, G.control, &control) < 0)
            die("epoll_ctl");
    }
    refill();
    for (;;) {
        int ready = epoll_wait(G.epoll, events, 64, next_timeout());
        if (ready < 0 && errno != EINTR)
            die("epoll_wait");
        for (int i = 0; i < ready; i++) {
            void *tag = events[i].data.ptr;
            if (tag == &LISTENER_TAG) {
                accept_all();
            } else if (tag == &CONTROL_TAG) {
                take_message();
            } else {
                struct end *end = tag;
                struct conn *conn = end->conn;
                if (conn->state == DONE)
                    continue;  /* ended by an earlier event of this batch */
                if (events[i].events & EPOLLERR && !(conn->state == CONNECTING && end->side == 1))
                    finish(conn);  /* a reset: SO_ERROR would say which; either way it is over */
                else if (conn->state != RELAYING && end->side == 0 && events[i].events & EPOLLHUP)
                    finish(conn);  /* the client left before its capsule side came */
                else if (conn->state == CONNECTING && end->side == 1)
                    connected_later(conn);
                else if (conn->state == RELAYING)
                    relay_ready(conn, end->side, events[i].events);
            }
        }
        expire();
        while (G.ended) {
            struct conn *gone = G.ended;
            G.ended = gone->next;
            free(gone);
        }
    }
}
