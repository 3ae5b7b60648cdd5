#!/usr/bin/python3
# The router namespace's shaping path (test/support/netns.ts, the `routed` topology): every
# forwarded IPv4 packet arrives on TUN device `tin`, waits here for its source link and then its
# destination link — each a queue at the link's rate (if capped) followed by the link's delay
# (± jitter), in the order packets reach each queue — and leaves on TUN device `tout`, from which the router's kernel forwards it by
# destination. netem would do this in the kernel; this kernel has none. Standard library only.
#
#   shaper.py '{"links": {"10.203.1.2": {"delayMs": 20, "jitterMs": 0, "rateKbit": 0}, ...}, "queueBytes": 262144}'
#
# A line on stdin, `{"links": {"10.203.1.2": {"delayMs": 60}}}`, reshapes those links from then
# on (a link that got longer: packets already held keep their times) and is answered `reshaped`.
# Exits when its stdin closes (the lab that started it is gone) or on SIGTERM.
import fcntl, heapq, json, os, random, select, signal, struct, sys, time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000


def open_tun(name):
    fd = os.open('/dev/net/tun', os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack('16sH', name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


class Direction:
    """One direction of a link: a FIFO at `rate` bytes/s (0: no cap) of at most `limit` bytes, then `delay` s ± `jitter`."""

    def __init__(self, delay, jitter, rate, limit):
        self.reshape(delay, jitter, rate)
        self.limit = limit
        self.free_at = 0.0  # when the queue has sent everything given to it
        self.last_out = 0.0  # jitter never reorders a direction (TCP would read it as loss)

    def reshape(self, delay, jitter, rate):
        self.delay, self.jitter, self.rate = delay, jitter, rate

    def pass_at(self, t, size):
        """When a packet of `size` bytes entering at `t` is through; None when the queue is full (dropped)."""
        if self.rate > 0:
            start = max(t, self.free_at)
            if (start - t) * self.rate > self.limit:
                return None
            self.free_at = start + size / self.rate
            t = self.free_at
        out = t + self.delay + (random.uniform(-self.jitter, self.jitter) if self.jitter > 0 else 0.0)
        out = max(out, self.last_out, t)
        self.last_out = out
        return out


def shape_of(link):
    """a link's (delay s, jitter s, rate bytes/s) from its JSON shape"""
    return link.get('delayMs', 0) / 1000, link.get('jitterMs', 0) / 1000, link.get('rateKbit', 0) * 125


def key_of(addr):
    return bytes(int(x) for x in addr.split('.'))


def main():
    cfg = json.loads(sys.argv[1])
    limit = cfg.get('queueBytes', 262144)
    up, down = {}, {}
    for addr, link in cfg['links'].items():
        up[key_of(addr)], down[key_of(addr)] = Direction(*shape_of(link), limit), Direction(*shape_of(link), limit)
    commands = b''
    tin, tout = open_tun('tin'), open_tun('tout')
    os.set_blocking(tin, False)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print('shaping', flush=True)
    held, seq = [], 0
    while True:
        timeout = max(0.0, held[0][0] - time.monotonic()) if held else None
        ready, _, _ = select.select([tin, sys.stdin], [], [], timeout)
        if sys.stdin in ready:
            data = os.read(sys.stdin.fileno(), 4096)
            if not data:
                return
            commands += data
            while b'\n' in commands:
                line, commands = commands.split(b'\n', 1)
                for addr, link in json.loads(line)['links'].items():
                    for d in (up[key_of(addr)], down[key_of(addr)]):
                        d.reshape(*shape_of(link))
                print('reshaped', flush=True)
        if tin in ready:
            while True:
                try:
                    pkt = os.read(tin, 65536)
                except BlockingIOError:
                    break
                # IPv4 between two of the lab's hosts only: nothing else is forwarded anywhere
                if len(pkt) < 20 or pkt[0] >> 4 != 4:
                    continue
                src, dst = up.get(pkt[12:16]), down.get(pkt[16:20])
                if src is None or dst is None:
                    continue
                t = src.pass_at(time.monotonic(), len(pkt))
                if t is not None:
                    heapq.heappush(held, (t, seq, dst, pkt))  # at the router at t; then its destination link
                    seq += 1
        now = time.monotonic()
        while held and held[0][0] <= now:
            t, _, dst, pkt = heapq.heappop(held)
            if dst is None:
                os.write(tout, pkt)
                continue
            t = dst.pass_at(t, len(pkt))
            if t is not None:
                heapq.heappush(held, (t, seq, None, pkt))
                seq += 1


if __name__ == '__main__':
    main()
