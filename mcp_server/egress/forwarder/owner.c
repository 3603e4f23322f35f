/* The owner check: who owns a client's socket, asked of sock_diag on the one netlink
 * socket the program keeps open (G.diag, made at its start). */
#include "forward.h"

#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <string.h>
#include <sys/socket.h>

/* The uid that owns the client's socket, or -1: nobody holds it any more (ENOENT, or a
 * reply with inode 0: a closed socket's remains, which report uid 0 whoever owned them),
 * or the kernel said something else.  egress/peer.py's essay says why each check. */
long owner_of(const struct sockaddr_in *client)
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

