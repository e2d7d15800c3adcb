"""How large a wire connection's receive buffer is (``server/wire.py``): small while frames are small,
larger while a large frame arrives or a peer streams, back to small after a burst.
"""

from __future__ import annotations

from sluice.common.wire import FrameReader

#: A connection's receive buffer, as it starts and as it returns to once a burst has passed. Most
#: connections only ever carry small frames (a push consumer's flow and acks, a fetch request), and
#: a dispatcher holds one per push consumer: 16 KiB, not 256, is what keeps 1,000 of them cheap
#: (``docs/dispatcher.md``, "What a consumer costs").
READ_BUFFER_MIN = 16 * 1024
#: The receive buffer until the hello is accepted: a hello is a few hundred bytes (a few KB with a
#: token), and a connection that never says hello must cost little (docs/limits.md).
READ_BUFFER_HELLO = 2 * 1024
#: The most one socket read may bring: the buffer grows to it for a large frame, or while reads
#: fill the buffer (a peer that streams), so a large produce batch takes as few reads as before.
READ_BUFFER_MAX = 256 * 1024
#: A frame with at least this much still to come is read into its own buffer by a service that
#: preallocates frames (``WireConnection.preallocates_frames``): the rest of it would not fit the
#: largest read buffer anyway. Smaller frames take the growing buffer as before, which holds several
#: of them per read (``docs/wire.md``, "Receiving a large frame": measured, reading a 100 KB frame into
#: its own buffer costs more CPU than the shared one; from about 600 KB it costs a quarter or less).
FRAME_BUFFER_MIN = READ_BUFFER_MAX


def next_buffer_size(
    size: int, nbytes: int, reader: FrameReader, low: int, direct: bool = False
) -> int | None:
    """The size of the next read's buffer after a read of ``nbytes`` into one of ``size``, or None to
    keep it: larger while a large frame is incomplete or the last read filled the buffer (more is
    waiting), back to ``low`` once a small read ended on a frame boundary. A new buffer costs one
    allocation per change of size, never one per read. ``direct``: the incomplete frame's rest is
    read into its own buffer, so this one keeps its size."""
    missing = reader.missing
    if direct:
        return None
    if nbytes == size or missing > size:
        wanted = min(READ_BUFFER_MAX, max(2 * size, missing))
    elif size > low and nbytes <= low and not reader.buffered:
        wanted = low
    else:
        return None
    return wanted if wanted != size else None
