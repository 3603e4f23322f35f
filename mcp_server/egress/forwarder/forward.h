/* ccw-forward's shared state and the seams between its files (ccw_forward.c's essay says
 * what the program does):
 *
 *   ccw_forward.c  the options, accepting and admitting connections, the loop
 *   owner.c        the owner check (sock_diag)
 *   capsule.c      the capsule's side: the spare pool, connecting a spare, the front end's way
 *   relay.c        a connection's life: its pipes, the splice relay, its end
 *   control.c      the control socket: what is told to the front end and taken from it
 */
#ifndef CCW_FORWARD_H
#define CCW_FORWARD_H

#define _GNU_SOURCE
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

enum message {
    MSG_SPARES = 'S', MSG_CONNECTED = 'C', MSG_FAILED = 'F', MSG_STATS = '?',
    MSG_WANT = 'W', MSG_CONNECT = 'R', MSG_REFUSED = 'X', MSG_ERROR = 'E', MSG_COUNTS = 'N',
};

/* The pool is refilled in one helper call (up to the helper's MAX_SPARES, sandbox/ops.py)
 * and passed here in one message: SCM_RIGHTS carries at most 253 descriptors (the
 * kernel's SCM_MAX_FD). */
#define MAX_SPARES 256       /* the pool's ceiling, whatever --pool says */
#define FDS_PER_MESSAGE 253  /* descriptors in one spares message */
#define CHUNK (1 << 16)      /* one splice: a default pipe's capacity */
#define MAX_IDLE_PIPES 32    /* empty pipe pairs of ended connections, kept for the next ones */

#define ACCEPT_PAUSE_MS 100     /* out of descriptors or memory: accept again after this */
#define FDS_PER_CONNECTION 6    /* two sockets, two pipes */
/* the program's own, the pool, a message's, the idle pipes */
#define RESERVED_FDS (32 + MAX_SPARES + FDS_PER_MESSAGE + 4 * MAX_IDLE_PIPES)

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

struct forward {
    int listen, control, diag, epoll;
    uid_t owner;
    int port, pool_size, max_open, timeout_ms;
    int spares[MAX_SPARES], nspares, wanting;
    int family;                 /* the spares' family: AF_INET, or AF_INET6 once a server was there alone */
    int idle_pipes[MAX_IDLE_PIPES][2][2], nidle_pipes;
    int open;
    uint64_t next_id, accepted, refused, errors, dropped;
    struct conn *waiting_head, *waiting_tail;
    struct conn *ended;         /* freed after each batch of events, which may still name them */
    struct sockaddr_in local;   /* the listener's own address: every client's other end */
    struct timespec resume;     /* accepting paused until then (tv_sec 0: not paused) */
};

extern struct forward G;

void die(const char *what) __attribute__((noreturn));

/* owner.c */
long owner_of(const struct sockaddr_in *client);

/* control.c */
void tellf(char code, const char *format, ...) __attribute__((format(printf, 2, 3)));
int take_message(void);

/* capsule.c */
void refill(void);
void take_spares(const int *fds, int nfds);
void no_delay(int fd);
int domain_of(int fd);
void follow_family(int domain);
void connect_spare(struct conn *conn);
void connected_later(struct conn *conn);
void ask_front_end(struct conn *conn);

/* relay.c */
void watch(struct end *end, uint32_t events, int op);
void finish(struct conn *conn);
void fail(struct conn *conn, const char *kind);
void start_relay(struct conn *conn, int capsule);
void relay_ready(struct conn *conn, int side, uint32_t events);

#endif
