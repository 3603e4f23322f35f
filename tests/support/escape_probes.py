"""Escape probes that need syscalls a shell cannot make: copied into the workspace, run in the jail.

``python3 escape_probes.py NAME [ARG]`` runs one probe.  A probe that gets what it
tried prints ``ESCAPED`` and exits 0; one the jail stops exits 1 after printing the
errno it got.  The syscall numbers come in ``CCW_NR`` form through the file itself:
the test prepends ``NR = {...}`` for the host's architecture (from sandbox/seccomp.py).
This file runs under the system python3 inside the jail: standard library only.
"""

import ctypes
import errno
import fcntl
import os
import socket
import stat
import struct
import sys
import time

NR: dict = globals().get("NR", {})  # set by the header the test writes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def sys_call(name, *args):
    """The raw syscall; OSError on failure."""
    converted = [a if isinstance(a, (ctypes.Array, ctypes.c_void_p)) else ctypes.c_long(a)
                 for a in args]
    ret = libc.syscall(ctypes.c_long(NR[name]), *converted)
    if ret < 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{name}: {os.strerror(number)}")
    return ret


def buf(size):
    return ctypes.create_string_buffer(size)


def ptr(buffer):
    return ctypes.c_void_p(ctypes.addressof(buffer))


def probe_ptrace_init(_):
    sys_call("ptrace", 16, 1, 0, 0)  # PTRACE_ATTACH to the jail's init


def probe_ptrace_sibling(_):
    pid = os.fork()
    if pid == 0:
        time.sleep(5)
        os._exit(0)
    try:
        sys_call("ptrace", 16, pid, 0, 0)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def probe_process_vm_readv(_):
    local, remote = buf(64), buf(16)
    local_iov = struct.pack("PN", ctypes.addressof(local), 64)
    remote_iov = struct.pack("PN", 0x400000, 64)
    liov, riov = ctypes.create_string_buffer(local_iov), ctypes.create_string_buffer(remote_iov)
    del remote
    sys_call("process_vm_readv", 1, ptr(liov), 1, ptr(riov), 1, 0)


def probe_open_by_handle_at(_):
    # "shocker": a handle for inode 2 (an ext4 root) opened against any mount fd.
    handle = ctypes.create_string_buffer(struct.pack("Ii", 8, 1) + struct.pack("II", 2, 0))
    mount_fd = os.open("/", os.O_RDONLY)
    sys_call("open_by_handle_at", mount_fd, ptr(handle), os.O_RDONLY)


def probe_clone_newuser(_):
    ret = sys_call("clone", 0x10000000 | 17, 0, 0, 0, 0)  # CLONE_NEWUSER | SIGCHLD
    if ret == 0:
        os._exit(0)
    os.waitpid(ret, 0)


def probe_unshare_user(_):
    sys_call("unshare", 0x10000000)


def probe_unshare_mount(_):
    sys_call("unshare", 0x00020000)


def probe_setns_every_fd(_):
    paths = [f"/proc/self/fd/{n}" for n in os.listdir("/proc/self/fd")]
    for pid in ("self", "1"):
        try:
            paths += [f"/proc/{pid}/ns/{n}" for n in os.listdir(f"/proc/{pid}/ns")]
        except OSError:
            pass
    entered = []
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            sys_call("setns", fd, 0)
            entered.append(path)
        except OSError:
            pass
        finally:
            os.close(fd)
    if entered:
        print("entered", entered)
        return
    raise OSError(errno.EPERM, f"setns refused on {len(paths)} descriptors")


def probe_chroot_escape(_):
    os.makedirs("/tmp/ccw-chroot", exist_ok=True)
    keep = os.open("/", os.O_RDONLY)
    os.chroot("/tmp/ccw-chroot")
    os.fchdir(keep)
    for _ in range(64):
        os.chdir("..")
    os.chroot(".")


def probe_keyctl(_):
    sys_call("keyctl", 0, -4, 1)  # KEYCTL_GET_KEYRING_ID of the user keyring, create


def probe_add_key(_):
    sys_call("add_key", ptr(buf(8)), ptr(ctypes.create_string_buffer(b"ccw")), ptr(buf(4)), 4, -4)


def probe_bpf(_):
    attr = ctypes.create_string_buffer(struct.pack("IIII", 2, 4, 4, 1) + bytes(56))  # BPF_MAP_TYPE_ARRAY
    sys_call("bpf", 0, ptr(attr), 72)


def probe_perf_event_open(_):
    attr = ctypes.create_string_buffer(struct.pack("IIQ", 1, 128, 0) + bytes(112))  # software cpu-clock
    sys_call("perf_event_open", ptr(attr), -1, 0, -1, 0)  # every process on cpu 0


def probe_io_uring(_):
    params = buf(120)
    sys_call("io_uring_setup", 8, ptr(params))


def probe_userfaultfd(_):
    sys_call("userfaultfd", os.O_CLOEXEC)


def _pty_slave():
    master = os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY)
    fcntl.ioctl(master, 0x40045431, struct.pack("i", 0))  # TIOCSPTLCK: unlock
    number = struct.unpack("I", fcntl.ioctl(master, 0x80045430, b"\0" * 4))[0]  # TIOCGPTN
    return os.open(f"/dev/pts/{number}", os.O_RDWR | os.O_NOCTTY)


def probe_tiocsti(_):
    try:
        fd = os.open("/dev/tty", os.O_RDWR)  # the controlling terminal, if there were one
    except OSError:
        fd = _pty_slave()
    fcntl.ioctl(fd, 0x5412, b"x")


def probe_tioclinux(_):
    fcntl.ioctl(_pty_slave(), 0x541C, b"\x0b")


def probe_finit_module(_):
    fd = os.open("/dev/null", os.O_RDONLY)
    sys_call("finit_module", fd, ptr(ctypes.create_string_buffer(b"")), 0)


def probe_init_module(_):
    image = ctypes.create_string_buffer(b"\x7fELF" + bytes(60))
    sys_call("init_module", ptr(image), 64, ptr(ctypes.create_string_buffer(b"")))


def probe_kexec_load(_):
    sys_call("kexec_load", 0, 0, 0, 0)


def probe_reboot(_):
    # A wrong second magic: even a privileged caller gets EINVAL, never a reboot.
    sys_call("reboot", 0xFEE1DEAD, 0, 0x1234567, 0)


def probe_syslog(_):
    sys_call("syslog", 3, ptr(buf(4096)), 4096)  # SYSLOG_ACTION_READ_ALL


def probe_settime(_):
    now = time.clock_gettime(time.CLOCK_REALTIME)  # the same time: harmless even if allowed
    spec = ctypes.create_string_buffer(struct.pack("qq", int(now), 0))
    sys_call("clock_settime", 0, ptr(spec))


def probe_sethostname(arg):
    name = arg.encode()
    if libc.sethostname(name, len(name)) != 0:
        raise OSError(ctypes.get_errno(), "sethostname")


def probe_mknod_char(_):
    os.mknod("/tmp/ccw-mem", stat.S_IFCHR | 0o600, os.makedev(1, 1))


def probe_mknod_block(_):
    os.mknod("/tmp/ccw-sda", stat.S_IFBLK | 0o600, os.makedev(8, 0))


def probe_raw_socket(_):
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)


def probe_packet_socket(_):
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))


def probe_unix_connect(path):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)


def probe_abstract_connect(name):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect("\0" + name)


def probe_tcp_connect(address):
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=3):
        pass


def probe_udp_dns(_):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(b"\0" * 12, ("192.0.2.1", 53))  # TEST-NET-1: unroutable by definition


def probe_resolve(_):
    try:
        socket.getaddrinfo("ccw-escape.invalid", 80)
    except socket.gaierror as exc:
        raise OSError(errno.EHOSTUNREACH, str(exc)) from None


def probe_tcp6_connect(address):
    host, port = address.rsplit(":", 1)
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
        sock.settimeout(3)
        # getaddrinfo keeps a "%eth0" scope id (a bare (host, port) tuple drops it: EINVAL).
        sock.connect(socket.getaddrinfo(host.strip("[]"), int(port), socket.AF_INET6)[0][4])


def probe_udp_reply(address):
    """A UDP datagram that gets an answer (a refused one raises ECONNREFUSED)."""
    host, port = address.rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(3)
        sock.connect((host, int(port)))
        sock.send(b"\0" * 12)
        sock.recv(512)


def _proxy_talk(proxy, request, expect):
    host, port = proxy.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=3) as sock:
        sock.sendall(request)
        answer = sock.recv(4096)
    if not answer.startswith(expect):
        raise OSError(errno.EACCES, f"proxy said {answer[:80]!r}")


def probe_proxy_connect(target):
    """CONNECT through the jail's HTTP proxy; 'escaped' when the proxy says 200."""
    _proxy_talk("10.99.0.1:3128", f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode(), b"HTTP/1.1 200")


def probe_socks_connect(target):
    """SOCKS5 CONNECT (domain form) to TARGET; 'escaped' when the reply is 0x00 (succeeded)."""
    host, port = target.rsplit(":", 1)
    with socket.create_connection(("10.99.0.1", 1080), timeout=3) as sock:
        sock.sendall(b"\x05\x01\x00")
        if sock.recv(2) != b"\x05\x00":
            raise OSError(errno.EACCES, "no no-auth method")
        name = host.encode()
        sock.sendall(b"\x05\x01\x00\x03" + bytes([len(name)]) + name + int(port).to_bytes(2, "big"))
        reply = sock.recv(10)
    if reply[1:2] != b"\x00":
        raise OSError(errno.EACCES, f"socks reply {reply[1]:#x}")


def probe_socks_udp_associate(_):
    with socket.create_connection(("10.99.0.1", 1080), timeout=3) as sock:
        sock.sendall(b"\x05\x01\x00")
        sock.recv(2)
        sock.sendall(b"\x05\x03\x00\x01" + bytes(6))
        reply = sock.recv(10)
    if reply[1:2] != b"\x00":
        raise OSError(errno.EACCES, f"socks reply {reply[1]:#x}")


def probe_net_admin(_):
    """Give the jail's interface another address (needs CAP_NET_ADMIN in its namespace)."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)  # NETLINK_ROUTE
    with sock:
        # RTM_NEWADDR for 10.98.0.9/32 on ifindex 2: refused with EPERM without the capability.
        body = (struct.pack("=BBBBI", socket.AF_INET, 32, 0, 0, 2)
                + struct.pack("=HH4s", 8, 1, socket.inet_aton("10.98.0.9")))
        header = struct.pack("=IHHII", 16 + len(body), 20, 0x1 | 0x4 | 0x400 | 0x200, 1, 0)
        sock.sendto(header + body, (0, 0))
        answer = sock.recv(4096)
        code = struct.unpack_from("=i", answer, 16)[0]
        if code < 0:
            raise OSError(-code, os.strerror(-code))


def probe_kill(pid):
    os.kill(int(pid), 9)


def probe_fd_leak(_):
    listing = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY)
    fds = sorted(int(n) for n in os.listdir(listing) if int(n) != listing)
    os.close(listing)
    targets = {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in fds}
    print("fds", targets)
    suspicious = [t for t in targets.values() if t.startswith(("socket:", "anon_inode:")) or "/capsules/" in t]
    if fds != [0, 1, 2] or suspicious:
        return  # a descriptor of the helper or front end is open: an escape route
    raise OSError(errno.EBADF, "only 0, 1 and 2 are open")


def probe_init_fds(_):
    # The init holds the report pipe to the helper: opening it would let the command
    # forge its own exit status.  Listing the numbers is allowed (uid 0 owns the dir).
    for name in os.listdir("/proc/1/fd"):
        path = f"/proc/1/fd/{name}"
        for flags in (os.O_WRONLY, os.O_RDONLY):
            try:
                os.close(os.open(path, flags))
            except OSError:
                continue
            print("opened", path)
            return
    raise OSError(errno.EACCES, "no descriptor of the init could be opened")


def probe_swapon(_):
    path = "/tmp/ccw-swap"
    with open(path, "wb") as handle:
        handle.write(bytes(1 << 16))
    name = ctypes.create_string_buffer(path.encode())
    sys_call("swapon", ptr(name), 0)


def probe_swapoff(_):
    sys_call("swapoff", ptr(ctypes.create_string_buffer(b"/tmp/ccw-swap")))


def probe_init_environ(_):
    with open("/proc/1/environ", "rb") as handle:
        print(handle.read())


def probe_capabilities(_):
    with open("/proc/self/status") as handle:
        fields = dict(line.split(":", 1) for line in handle if ":" in line)
    caps = {k: int(fields[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
    # A root caller's jail keeps the file-ownership four (sandbox/rootcaps.py): CHOWN,
    # DAC_OVERRIDE, FOWNER, FSETID (0x1b), never inheritable or ambient; anything more escaped.
    allowed = 0x1B if os.getuid() == 0 else 0
    if (caps["CapInh"] or caps["CapAmb"] or any(v & ~allowed for v in caps.values())
            or fields["NoNewPrivs"].strip() != "1" or fields["Seccomp"].strip() != "2"):
        print(caps, fields["NoNewPrivs"], fields["Seccomp"])
        return
    raise OSError(errno.EPERM, "no capabilities, no_new_privs, seccomp filter")


def probe_personality(_):
    pid = os.fork()
    if pid == 0:
        ok = libc.personality(0x0040000) >= 0  # ADDR_NO_RANDOMIZE
        os._exit(0 if ok else 1)
    if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:
        raise OSError(errno.EPERM, "personality refused")


def main() -> None:
    name, arg = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "")
    try:
        globals()["probe_" + name](arg)
    except OSError as exc:
        print(f"denied: {errno.errorcode.get(exc.errno or 0, exc.errno)} {exc}")
        sys.exit(1)
    print("ESCAPED")


if __name__ == "__main__":
    main()
