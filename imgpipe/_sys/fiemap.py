"""Where a file's data lies on its disk: the physical byte offset of its first extent (Linux's FIEMAP ioctl).

ext4, xfs and btrfs answer it for any user who can open the file; tmpfs, network and FUSE file
systems do not (``OSError``: ``UNSUPPORTED``). A file with no data on the disk (empty, or held
inline in its inode) has no offset.
"""

from __future__ import annotations

import errno
import fcntl
import struct

FS_IOC_FIEMAP = 0xC020660B
FIEMAP_FLAG_SYNC = 0x1  # write the file's dirty data first, so that delayed allocation has placed it
FIEMAP_EXTENT_DATA_INLINE = 0x200
UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL, errno.ENOSYS})
_HEAD = struct.Struct("=QQLLLL")  # fm_start, fm_length, fm_flags, fm_mapped_extents, fm_extent_count, fm_reserved
_EXTENT = struct.Struct("=QQQQQLLLL")  # fe_logical, fe_physical, fe_length, 2 reserved, fe_flags, 3 reserved


def first_extent(fd: int, sync: bool = False) -> int | None:
    """The physical offset of the first extent of the open file ``fd``; None if it has none on the disk."""
    request = bytearray(_HEAD.size + _EXTENT.size)
    _HEAD.pack_into(request, 0, 0, 2**64 - 1, FIEMAP_FLAG_SYNC if sync else 0, 0, 1, 0)
    fcntl.ioctl(fd, FS_IOC_FIEMAP, request, True)
    if _HEAD.unpack_from(request, 0)[3] == 0:
        return None
    _, physical, _, _, _, flags, *_ = _EXTENT.unpack_from(request, _HEAD.size)
    return None if flags & FIEMAP_EXTENT_DATA_INLINE else physical
