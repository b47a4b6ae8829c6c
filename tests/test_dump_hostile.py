"""Hostile dumps (issue 16 items 4, 5, 7): archive bombs hit a named limit quickly and in little
memory, directory dumps never read outside themselves nor hang, and values the simulator
cannot hold are one line (exit 65) naming the file and line."""

from __future__ import annotations

import bz2
import io
import json
import os
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path

import pytest

from umbp_sim.dump import DumpError, load_dump, open_dump
from umbp_sim.dump.archive import tar_source
from umbp_sim.dump.limits import ArchiveLimits, DumpLimitError

MEMINFO = b"MemTotal:       16777216 kB\nMemFree:        8388608 kB\n"
SECRET = "root:$6$hostile-secret-line:19000:0:99999:7:::"


def tar_bytes(members: list[tarfile.TarInfo | tuple[str, bytes]], fmt=tarfile.GNU_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for m in members:
            if isinstance(m, tarfile.TarInfo):
                tar.addfile(m)
            else:
                info = tarfile.TarInfo(m[0])
                info.size = len(m[1])
                tar.addfile(info, io.BytesIO(m[1]))
    return buf.getvalue()


def header(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    """One raw header claiming ``size`` bytes of data (the data itself is not written)."""
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    return info.tobuf(format=tarfile.GNU_FORMAT)


def limit_of(data: bytes, **limits: int) -> DumpLimitError:
    with pytest.raises(DumpLimitError) as exc:
        tar_source(data, "bomb.tar", ArchiveLimits(**limits))  # type: ignore[arg-type]
    assert "\n" not in str(exc.value) and exc.value.exit_code == 65
    return exc.value


# ---- each limit, named -----------------------------------------------------------------------


def test_long_name_header_is_refused_before_it_is_read() -> None:
    # the header claims 2 GB and the data is not even there: refused on the claim alone
    e = limit_of(header("././@LongLink", 2_000_000_000, tarfile.GNUTYPE_LONGNAME))
    assert e.limit == "max_header"
    assert str(e) == (
        "bomb.tar: over the header-size limit: a GNU long-name header of 2000000000 bytes "
        "(at most 65536)"
    )


def test_pax_header_is_refused_before_it_is_read() -> None:
    e = limit_of(header("././@PaxHeader", 600_000_000, tarfile.XHDTYPE))
    assert e.limit == "max_header" and "a pax header of 600000000 bytes" in str(e)


def test_member_count() -> None:
    members = [tarfile.TarInfo(f"H/e{i}") for i in range(50)]
    e = limit_of(tar_bytes(members), max_members=20)
    assert str(e) == "bomb.tar: over the member-count limit: more than 20 members"


def test_unpacked_bytes() -> None:
    data = bz2.compress(header("H/big", 1 << 40) + bytes(8 << 20))
    e = limit_of(data, max_unpacked=4 << 20)
    assert str(e) == (
        "bomb.tar: over the unpacked-size limit: more than 4194304 bytes after decompression"
    )


def test_stream_count() -> None:
    e = limit_of(bz2.compress(b"") * 200, max_streams=100)
    assert str(e) == (
        "bomb.tar: over the stream-count limit: more than 100 concatenated compressed streams"
    )


def test_kept_bytes() -> None:
    files = [(f"H/sys/kernel/mm/hugepages/x{i}", bytes(1000)) for i in range(10)]
    e = limit_of(tar_bytes([("H/proc/meminfo", MEMINFO), *files]), max_kept=5000)
    assert e.limit == "max_kept"


def test_archive_size() -> None:
    e = limit_of(tar_bytes([("H/proc/meminfo", MEMINFO)]), max_archive=1024)
    assert str(e) == "bomb.tar: over the archive-size limit: larger than 1024 bytes"


def test_time() -> None:
    members = [tarfile.TarInfo(f"H/e{i}") for i in range(3000)]
    e = limit_of(tar_bytes(members), max_seconds=0)  # type: ignore[arg-type]
    assert str(e) == "bomb.tar: over the time limit: still reading after 0 s"


def test_deep_names_are_refused_not_quadratic() -> None:
    name = "H" + "/d" * 3000  # 6001 characters: over max_name (4096)
    dirs = [tarfile.TarInfo(name)]
    dirs[0].type = tarfile.DIRTYPE
    src = tar_source(tar_bytes([*dirs, ("H/proc/meminfo", MEMINFO)]), "deep.tar")
    assert src.rejected == [name[:200]]
    assert src.listdir("proc") == ["meminfo"]


def test_a_good_archive_still_reads_with_pax_and_long_names() -> None:
    long_dir = "H/sys/kernel/mm/hugepages/hugepages-2048kB/"
    members = [
        ("H/proc/meminfo", MEMINFO + b"HugePages_Total: 4\nHugepagesize: 2048 kB\n"),
        (long_dir + "nr_hugepages", b"4\n"),
        ("H/" + "x" * 300, b"ignored"),  # a long name that is not a dump file
    ]
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT):
        usable = members if fmt != tarfile.USTAR_FORMAT else members[:2]
        for compress in (lambda b: b, zlib.compress, bz2.compress):
            data = tar_bytes(usable, fmt)  # type: ignore[arg-type]
            data = data if compress is zlib.compress else compress(data)
            if compress is zlib.compress:
                c = zlib.compressobj(6, zlib.DEFLATED, 31)  # gzip framing
                data = c.compress(data) + c.flush()
            machine, facts = load_dump(data)
            assert facts.hugepages[2 << 20].total == 4, (fmt, compress)


# ---- the bombs, at the default limits, in a fresh process ----------------------------

CHILD = """
import json, resource, sys, time
from umbp_sim.dump import DumpError, load_dump
out = []
for path in sys.argv[1:]:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.process_time()  # CPU seconds: the work, whatever else the machine runs
    try:
        load_dump(path)
        msg = "loaded"
    except DumpError as e:
        msg = str(e)
    out.append({"path": path, "seconds": time.process_time() - t, "message": msg,
                "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before})
print(json.dumps(out))
"""


def _gzip_of_repeats(head: bytes, unit: bytes, count: int) -> bytes:
    """gzip framing around ``head`` then ``unit`` * ``count``, without compressing it all:
    a block after a full flush stands alone, so it can be repeated."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    first = c.compress(head) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(unit) + c.flush(zlib.Z_FULL_FLUSH)
    return first + block * count + c.flush()


def _nested_dirs(depth: int, stop: int) -> bytes:
    c = zlib.compressobj(1, zlib.DEFLATED, 31)
    out, size, name = [], 0, "H/"
    for _ in range(depth):
        name += "d/"
        data = name.encode() + b"\0"
        pad = -len(data) % 512
        chunk = header("././@LongLink", len(data), tarfile.GNUTYPE_LONGNAME) + data + bytes(pad)
        chunk += header("H/d", 0, tarfile.DIRTYPE)
        out.append(c.compress(chunk))
        size += len(chunk)
        if size > stop:
            break
    return b"".join(out) + c.flush()


def test_bombs_end_fast_in_little_memory(tmp_path: Path) -> None:
    bombs = {
        # 2 GB GNU long name in a ~2 MB .tar.gz (issue: 2.13 GB of memory)
        "longname.tar.gz": _gzip_of_repeats(
            header("././@LongLink", 2_000_000_000, tarfile.GNUTYPE_LONGNAME), b"a" * 2**20, 1907
        ),
        # 1M empty members (issue: 658 MB, 51 s)
        "many.tar.gz": _gzip_of_repeats(b"", header("H/e", 0), 1_000_000),
        # 30,000 nested directories (issue: 2.69 GB): H/d/, H/d/d/, ... (cut at 300 MB)
        "nested.tar.gz": _nested_dirs(30_000, 300 << 20),
        # concatenated bzip2 streams of zeros (issue: 200 GiB, 18 minutes)
        "zeros.tar.bz2": bz2.compress(header("H/big", 200 << 30))
        + bz2.compress(bytes(64 << 20)) * 64,
        # 15M empty bzip2 streams
        "empty.tar.bz2": bz2.compress(b"") * 1_000_000,
    }
    paths = []
    for name, data in bombs.items():
        (tmp_path / name).write_bytes(data)
        paths.append(str(tmp_path / name))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, *paths], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    results = {Path(r["path"]).name: r for r in json.loads(out.stdout)}
    expected = {
        "longname.tar.gz": "over the header-size limit",
        "many.tar.gz": "over the member-count limit",
        "nested.tar.gz": "over the unpacked-size limit",
        "zeros.tar.bz2": "over the unpacked-size limit",
        "empty.tar.bz2": "over the stream-count limit",
    }
    for name, r in results.items():
        assert expected[name] in r["message"], r
        assert r["seconds"] < 5, r
        assert r["peak_kib"] < 256 * 1024, r


# ---- directory dumps ---------------------------------------------------------------------------


def dump_dir(root: Path) -> Path:
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "meminfo").write_bytes(MEMINFO)
    return root


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_fifo_in_a_dump_is_an_error_not_a_hang(tmp_path: Path) -> None:
    d = dump_dir(tmp_path / "d")
    os.mkfifo(d / "proc" / "version")
    (d / "proc" / "meminfo").unlink()
    os.mkfifo(d / "proc" / "meminfo")
    with pytest.raises(DumpError) as exc:
        load_dump(d)
    assert str(exc.value) == f"{d}/proc/meminfo: is a FIFO, expected a regular file"


def test_fifo_as_the_dump_is_an_error(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "dump")
    with pytest.raises(DumpError) as exc:
        load_dump(tmp_path / "dump")
    assert str(exc.value) == (
        f"{tmp_path}/dump: is a FIFO, expected a dump directory, tarball or meminfo file"
    )


LEAVES = "a symbolic link leaving the dump: not followed (a dump holds copies, not links)"


def test_symlink_out_of_the_dump_is_refused_unread(tmp_path: Path) -> None:
    """A file or directory the reader asks for that is a link out of the dump (a dump made of
    links to the live /proc, or a planted one) is one line naming it, never read, never
    replayed as a machine without that file."""
    secret = tmp_path / "shadow"
    secret.write_text(SECRET + "\n")
    d = dump_dir(tmp_path / "d")
    (d / "proc" / "sys" / "kernel").mkdir(parents=True)
    (d / "proc" / "sys" / "kernel" / "osrelease").symlink_to(secret)
    with pytest.raises(DumpError) as exc:
        load_dump(d)
    assert str(exc.value) == f"{d}/proc/sys/kernel/osrelease: {LEAVES}"
    (d / "proc" / "sys" / "kernel" / "osrelease").unlink()
    (d / "sys").symlink_to(tmp_path)  # a whole directory pointing out
    with pytest.raises(DumpError) as exc:
        load_dump(d)
    assert str(exc.value).startswith(f"{d}/sys")
    assert str(exc.value).endswith(f": {LEAVES}")


@pytest.mark.parametrize("target", ["/proc/meminfo", "../../../../../../../../proc/meminfo"])
def test_meminfo_linked_to_the_live_host_is_refused(tmp_path: Path, target: str) -> None:
    d = dump_dir(tmp_path / "d")
    (d / "proc" / "meminfo").unlink()
    (d / "proc" / "meminfo").symlink_to(target)
    with pytest.raises(DumpError) as exc:
        load_dump(d)
    assert str(exc.value) == f"{d}/proc/meminfo: {LEAVES}"
    assert exc.value.kind == "unreadable"


def test_symlink_to_an_outside_meminfo_is_not_quoted(tmp_path: Path) -> None:
    secret = tmp_path / "shadow"
    secret.write_text(SECRET + "\n")
    d = tmp_path / "d"
    (d / "proc").mkdir(parents=True)
    (d / "proc" / "meminfo").symlink_to(secret)
    with pytest.raises(DumpError) as exc:
        load_dump(d)
    assert SECRET[:10] not in str(exc.value)
    assert str(exc.value) == f"{d}/proc/meminfo: {LEAVES}"


def test_symlink_inside_the_dump_is_followed(tmp_path: Path) -> None:
    d = dump_dir(tmp_path / "d")
    (d / "proc" / "sys" / "kernel").mkdir(parents=True)
    (d / "release").write_text("5.15.0\n")
    (d / "proc" / "sys" / "kernel" / "osrelease").symlink_to("../../../release")
    assert load_dump(d)[1].kernel_version == "5.15.0"


def test_directory_where_a_file_belongs(tmp_path: Path) -> None:
    d = dump_dir(tmp_path / "d")
    (d / "proc" / "sys" / "kernel" / "osrelease").mkdir(parents=True)
    with pytest.raises(DumpError) as exc:
        load_dump(d)
    assert str(exc.value) == (
        f"{d}/proc/sys/kernel/osrelease: is a directory, expected a regular file"
    )


def test_each_file_is_opened_once_and_no_fd_leaks(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    d = dump_dir(tmp_path / "d")
    (tmp_path / "empty").mkdir()
    before = open_fds()
    opened: list[str] = []
    real_open = os.open

    def counting_open(path, flags, mode=0o777, *, dir_fd=None):  # type: ignore[no-untyped-def]
        if not flags & os.O_DIRECTORY:
            opened.append(str(path))
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", counting_open)
    for _ in range(20):
        load_dump(d)
        with pytest.raises(DumpError):
            load_dump(tmp_path / "empty")  # not a dump: subdirectory scan, nothing found
    monkeypatch.undo()
    assert opened.count("meminfo") == 20  # proc/meminfo once per load, not per read
    assert open_fds() == before


def test_open_dump_nofollow_and_bare(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_bytes(MEMINFO)
    (tmp_path / "link").symlink_to(tmp_path / "meminfo")
    with pytest.raises(DumpError, match="is a symbolic link"):
        open_dump(tmp_path / "link", follow_symlinks=False)
    with pytest.raises(DumpError, match="a bare meminfo file is not accepted here"):
        open_dump(tmp_path / "meminfo", bare=False)
    assert open_dump(tmp_path / "link").bare_meminfo


# ---- values the simulator cannot hold ------------------------------------------------------------


@pytest.mark.parametrize(
    "meminfo, message",
    [
        (
            "MemTotal: 18014398509481984 kB\n",
            "m:1: MemTotal 18014398509481984 kB is beyond what umbp-sim simulates "
            "(below 2^62 bytes)",
        ),
        (
            "MemTotal: 1024 kB\nCommitted_AS: 18446744073709551615 kB\n",
            "m:2: Committed_AS 18446744073709551615 kB is beyond what umbp-sim simulates "
            "(below 2^62 bytes)",
        ),
        (
            "MemTotal: " + "9" * 5000 + " kB\n",
            "m:1: value 999999999999...(5000 digits) for MemTotal does not fit in 64 bits",
        ),
    ],
)
def test_numbers_beyond_the_simulator(meminfo: str, message: str) -> None:
    from umbp_sim.dump import MemorySource

    with pytest.raises(DumpError) as exc:
        load_dump(MemorySource({"proc/meminfo": meminfo.encode()}, "m", "m", bare_meminfo=True))
    assert str(exc.value) == message


def test_kernel_release_beyond_any_kernel(tmp_path: Path) -> None:
    d = dump_dir(tmp_path / "d")
    (d / "proc" / "sys" / "kernel").mkdir(parents=True)
    (d / "proc" / "sys" / "kernel" / "osrelease").write_text("6.99999999999\n")
    with pytest.raises(DumpError) as exc:
        load_dump(d)
    assert str(exc.value) == (
        f"{d}/proc/sys/kernel/osrelease:1: kernel release '6.99999999999': 99999999999 is "
        "beyond any kernel (each part at most 65535)"
    )


def test_hugepage_pool_beyond_the_simulator() -> None:
    from umbp_sim.dump import MemorySource

    hp = "sys/kernel/mm/hugepages/hugepages-1048576kB/"
    files = {
        "proc/meminfo": MEMINFO,
        hp + "nr_hugepages": b"9223372036854775807\n",
        hp + "free_hugepages": b"0\n",
    }
    with pytest.raises(DumpError) as exc:
        load_dump(MemorySource(files, "h.tar", "h"))
    assert "is beyond what the simulator holds (below 2^62 bytes)" in str(exc.value)
    assert str(exc.value).startswith("h.tar: inconsistent dump: nodes[0].hugepages[1073741824]")
