/* ccw-forward: one forwarded port's accept loop and relay, run by the front end
 * (mcp_server/egress/forward.py) for each port that capsule_port opens.
 *
 * Why C (ARCHITECTURE.md, "Decisions": no C without a measured reason).  In the front end each
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
 * Where a fresh connection's time goes (issue 36; perf stat on this program, 2000 fresh
 * connections a run, on a busy 2-core VM): about 100 us of CPU each, nearly all in the
 * kernel: the second TCP connection's handshake and teardown (loopback's softirq work is
 * charged to whoever sends), under two context switches, the owner check's two netlink
 * calls.  Dropping what this program could (two pipes made and closed, the spare's flags
 * and family, the connect's epoll round, the wake-up for an EOF that came with the
 * answer) took it from 115-122 us to 99-102 us.  More had gone to the pool's refills
 * through the front end (capsule.c).  Then the path itself: the client's TCP_NODELAY comes
 * from the listener (accepted sockets inherit it), a spare's is set as it arrives, each side
 * joins the epoll set once with its interest, and a spare that polls writable with no error
 * is relayed without asking SO_ERROR: strace -c, 150 fresh connections, 31 calls a
 * connection before and 27 after (epoll_ctl 5 to 3, setsockopt 2 to 1 and off the path,
 * getsockopt 1 to 0).
 *
 * The floor (issue 36's target: a rate through the port of at least 0.8x the same server's
 * reached straight on its loopback).  ``bench/run.py services`` reaches the capsule's own
 * server both ways, the client joined to the capsule's network namespace for the direct
 * one, so the forward is the only difference (8 runs at load 1.3-1.9 on the 2 cores, each
 * run's rate ratio).  A request on a kept connection: 0.47-0.68x.  The direct request is
 * two loopback hops and two wake-ups (client to server, server to client; 21-45 us in
 * all); the forward adds two of each, 13-21 us of this program's CPU a request (perf stat:
 * two context switches and six syscalls, epoll_wait and two splices a hop, the fewest a
 * relay in user space makes), nearly all the kernel's TCP send and the receiver's
 * delivery, charged to whoever sends.  A relay's hop costs about what the client's and
 * the server's do, so the rate nears half.  A fresh connection: 0.68-0.83x for the fast
 * server, 65-90 us of this program's CPU each (perf record: a third in the second
 * connection's handshake and its FINs, a quarter in the splices, a fifth in epoll_wait's
 * sleeps and wake-ups, a tenth in the accept and the owner check's calls);
 * http.server, whose GET costs three times the fast one's, 0.86-0.97x in the three runs
 * of 9 rounds (0.58-1.41x in the five earlier runs of 5 rounds).  What the capsule costs the server is not in
 * these ratios: the report's host-run server says it (the capsule's server was 0.52-1.02x
 * the host-run one's rate on fresh connections and 0.93-1.45x on a kept one).
 *
 * What reached the target instead is not a relay: with a privileged helper the owner's
 * connections are led into the capsule by NAT (sandbox/kernel_ports.py), and never reach
 * this program; it serves a rootless helper's forwards, servers on ::1 alone, and every
 * other uid's connection, which it refuses.
 *
 * Tried and not kept, twice: a BPF sockhash with an SK_SKB verdict program redirecting each
 * side's bytes to the other.  The first prototype (host loopback, against this program in
 * the same runs) passed a server's FIN on at once, and it overtook the answer still queued
 * for the kernel's worker (the client saw EOF and no bytes).  The second (a relay from the
 * host's loopback into a network namespace holding the fast server, splice and sockmap side
 * by side against the client joined to the namespace, the hashes keyed by socket cookie,
 * a side's EOF passed on only once the peer's TCP had every byte; 7 runs of 9 interleaved
 * rounds at load 1.6-2.9): kept alive 0.68-0.78x (stream verdict) and 0.69-0.79x (verdict)
 * against splice's 0.58-0.73x, ahead in every run by 0.03-0.16, never at 0.8x; fresh
 * connections 0.65-0.74x against 0.70-0.90x, behind in every run (the relay's CPU per
 * connection the same, 73 us: four map inserts where the splices were, then each socket's
 * psock torn down by a worker).  The wake-up does not go away: the kernel queues every
 * redirected skb for a worker (sk_psock_skb_redirect), so each hop wakes a kworker instead
 * of this program (context switches per kept request: kworkers 2.7, client and server 3.2
 * against 2.0).  And the kernel's path has no back-pressure: a reader stalled 5.5 s had
 * 512 MiB queued for it in kernel memory charged to no socket (splice: 11 MiB), bytes for
 * a peer that has closed are dropped after TCP acknowledged them, and nothing wakes the
 * relay when the worker has sent a side's last byte, so an EOF waits, polled.  A capsule's
 * server could so pin half a gigabyte of the host's memory per connection: a relay in
 * user space, whose pipes bound what is in flight, is the safer design as well.
 * And, each against this program in the same runs (the forward's own rate ratio, perf
 * stat's CPU per GET, medians of 6-12 rounds): recv and send through one buffer instead
 * of the splices, the pipe kept for what the other side does not take at once (the same
 * calls a hop): on a kept connection 16-19 us a request against 18-21 and 0.61-0.64x
 * against 0.59-0.63x in three runs, fresh ones within the runs' spread; a few percent,
 * far from the target, for giving up splice's page moves on large transfers.  Reno on
 * the spares instead of the system's BBR (no pacing timers, as splice.unpaced gives the
 * jail's side): no change.  Polling epoll without sleeping for 10, 30 or 50 us after each
 * batch, to be awake when the answer comes: worse, 0.50x, 0.45x and 0.39x against 0.62x
 * kept alive, as the spin takes the CPU the client and the server need (this program's
 * CPU per kept request 26, 37 and 43 us against 13).
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
#include "forward.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

static const struct { const char *name; char code; } PROTOCOL[] = {
    {"spares", MSG_SPARES}, {"connected", MSG_CONNECTED}, {"failed", MSG_FAILED}, {"stats", MSG_STATS},
    {"want", MSG_WANT}, {"connect", MSG_CONNECT}, {"refused", MSG_REFUSED}, {"error", MSG_ERROR},
    {"counts", MSG_COUNTS},
};

struct forward G;

static char LISTENER_TAG, CONTROL_TAG;  /* epoll data for the two descriptors that are no connection's */

void die(const char *what)
{
    fprintf(stderr, "ccw-forward: %s: %s\n", what, strerror(errno));
    exit(1);
}

/* --- connections ---------------------------------------------------------------------- */

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
    connect_spare(conn);
    /* Still waiting for its capsule side: watched with no interest, for its hang-up.  One
     * relayed at once was added to the set by the relay, with its interest. */
    if (conn->state == WAITING || conn->state == CONNECTING)
        watch(&conn->end[0], 0, EPOLL_CTL_ADD);
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
        printf("limit reserved_fds %d\nlimit fds_per_connection %d\n", RESERVED_FDS, FDS_PER_CONNECTION);
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
    /* Accepted sockets inherit TCP_NODELAY from their listener, so none is set per connection.
     * The front end sets it before listening (a client may connect before this runs); set
     * here too for a listener made without it. */
    if (setsockopt(G.listen, IPPROTO_TCP, TCP_NODELAY, &(int){1}, sizeof(int)) < 0)
        die("setsockopt TCP_NODELAY");
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
    /* The first spares, if the front end put them on the control socket before starting
     * this program: taken before asking for more, so the first ask is for what they left. */
    while (take_message())
        ;
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
