/* A connection's life once admitted: its two pipes, the splice relay (ccw_forward.c's
 * essay), and its end.
 *
 * Pipes are kept: an ended connection whose pipes are empty (every byte read into them
 * was written out) gives them to the next one, up to MAX_IDLE_PIPES pairs, which saves
 * two pipe2 and four close calls of every fresh connection.  An empty pipe holds nothing
 * of the connection that used it; a pipe with bytes left (a side reset mid-write) is
 * closed, never reused. */
#include "forward.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

void watch(struct end *end, uint32_t events, int op)
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

/* Two pipes for a connection: idle ones if any, else new.  0, or -1 (out of descriptors). */
static int take_pipes(struct conn *conn)
{
    if (G.nidle_pipes > 0) {
        G.nidle_pipes--;
        for (int side = 0; side < 2; side++)
            for (int i = 0; i < 2; i++)
                conn->pipe[side][i] = G.idle_pipes[G.nidle_pipes][side][i];
        return 0;
    }
    for (int side = 0; side < 2; side++)
        if (pipe2(conn->pipe[side], O_CLOEXEC | O_NONBLOCK) < 0)
            return -1;
    return 0;
}

/* An ended connection's pipes: kept if both are there and empty and there is room, else closed. */
static void give_back_pipes(struct conn *conn)
{
    int whole = conn->held[0] == 0 && conn->held[1] == 0;
    for (int side = 0; side < 2; side++)
        for (int i = 0; i < 2; i++)
            whole = whole && conn->pipe[side][i] >= 0;
    if (whole && G.nidle_pipes < MAX_IDLE_PIPES) {
        for (int side = 0; side < 2; side++)
            for (int i = 0; i < 2; i++)
                G.idle_pipes[G.nidle_pipes][side][i] = conn->pipe[side][i];
        G.nidle_pipes++;
        return;
    }
    for (int side = 0; side < 2; side++)
        for (int i = 0; i < 2; i++)
            if (conn->pipe[side][i] >= 0)
                close(conn->pipe[side][i]);
}

void finish(struct conn *conn)
{
    unlink_waiting(conn);
    for (int side = 0; side < 2; side++)
        if (conn->end[side].fd >= 0)
            close(conn->end[side].fd);  /* also leaves the epoll set */
    give_back_pipes(conn);
    G.open--;
    conn->state = DONE;
    conn->next = G.ended;
    G.ended = conn;
}

void fail(struct conn *conn, const char *kind)
{
    G.errors++;
    tellf(MSG_ERROR, "%s %s %d", kind, conn->peer, conn->peer_port);
    finish(conn);
}

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
            events |= EPOLLIN | EPOLLRDHUP;  /* RDHUP: its EOF is already there, read on to it */
        if (conn->held[1 - side] > 0)
            events |= EPOLLOUT;
        /* A side joins the set here, with its interest, the first time (one call, not an
         * add and a change); even with none, for its hang-up. */
        if (!conn->watched[side])
            watch(&conn->end[side], events, EPOLL_CTL_ADD);
        else if (events != conn->interest[side])  /* a request on a kept connection changes none */
            watch(&conn->end[side], events, EPOLL_CTL_MOD);
    }
}

/* Move what end ``from`` has for the other end, as far as both allow: until ``from`` has
 * nothing more to read (EPOLLIN says when it has), or the other end takes no more
 * (EPOLLOUT on it resumes).  ``ended``: ``from`` has sent its EOF (EPOLLRDHUP), so a short
 * read is no reason to stop: the next read finds the EOF, and passing it on needs no
 * further wake-up (a server that answers and closes: its answer and EOF in one).
 * 0, or -1: the connection failed. */
static int pump(struct conn *conn, int from, int ended)
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
        if (!full && !ended)
            return 0;  /* a short read emptied the queue; EPOLLIN (level-triggered) says when there is more */
    }
}

/* ``events`` on end ``side``: its bytes to read (or its end), or room for the other end's. */
void relay_ready(struct conn *conn, int side, uint32_t events)
{
    if ((events & ~EPOLLOUT && pump(conn, side, (events & EPOLLRDHUP) != 0) < 0)
        || (events & EPOLLOUT && pump(conn, 1 - side, 0) < 0)) {
        finish(conn);  /* a reset or a broken pipe: the connection is over, not an error of the port's */
        return;
    }
    if (conn->eof[0] && conn->eof[1] && conn->held[0] == 0 && conn->held[1] == 0) {
        finish(conn);
        return;
    }
    rewatch(conn);
}

/* ``capsule``: connected, with TCP_NODELAY set (a spare's as it came, take_spares; the
 * front end's as it comes, control.c), as the client's has from the listener. */
void start_relay(struct conn *conn, int capsule)
{
    unlink_waiting(conn);
    conn->state = RELAYING;
    conn->end[1].fd = capsule;
    if (take_pipes(conn) < 0) {
        fail(conn, "pipe");
        return;
    }
    G.accepted++;
    relay_ready(conn, 0, EPOLLIN);  /* what the client sent while it waited; rewatch adds both sides */
}
