#!/bin/sh
# umbp-sim's host collector, stand-alone: a POSIX shell and the usual tools (cat, find, grep,
# awk, sed, sort, tar, and gzip/bzip2/xz for a compressed output).
#
#     sh collect.sh [-o FILE.tar.gz] [--name NAME] [--pid PID]
#
# Writes the tarball `umbp-sim collect` writes (`umbp-sim replay FILE` reads it): /proc/meminfo,
# the vm sysctls, the kernel release, the limits, /sys/kernel/mm/hugepages, the NUMA nodes and
# the effective cgroup limits, under NAME/, with NAME/umbp-sim-collect.json listing what was
# collected, what was missing and why, and what was left out, and recording the architecture
# ("machine": uname -m) and the base page size ("page_size": getconf PAGESIZE).
#
# --pid PID: the limits, cgroup and NUMA policy are the ones that process saw (its
# /proc/PID/limits, /proc/PID/cgroup, the Mems_allowed lines of /proc/PID/status and its
# numa_maps without file names), not this script's. Never read: environment variables
# (/proc/*/environ) and command lines (/proc/*/cmdline), of any process.
#
# -o FILE writes a new file or replaces a regular one (atomically: a new file moved into
# place); a symbolic link, a directory, a device, a FIFO or a socket there is refused before any
# collecting. -o - writes the tarball (gzip) to stdout, unless stdout is a terminal.
#
# Exit 0 written, 64 bad usage, 73 the output cannot be written (or is refused). Nothing else is
# fatal.

set -u
PROG=collect.sh
USAGE="usage: collect.sh [-o FILE.tar.gz] [--name NAME] [--pid PID]"
MANIFEST=umbp-sim-collect.json
TAB=$(printf '\t')

usage() {
    printf '%s: %s\n%s\n' "$PROG" "$1" "$USAGE" >&2
    exit 64
}

OUT=
NAME=
PID=
ROOT=
while [ $# -gt 0 ]; do
    arg=$1
    case $arg in
        -h | --help) printf '%s\n' "$USAGE"; exit 0 ;;
        -o=* | --output=*) OUT=${arg#*=} ;;
        --name=*) NAME=${arg#*=} ;;
        --pid=*) PID=${arg#*=} ;;
        --root=*) ROOT=${arg#*=} ;;
        -o | --output | --name | --pid | --root)
            [ $# -ge 2 ] || usage "$arg: expects a value"
            case $arg in
                -o | --output) OUT=$2 ;;
                --name) NAME=$2 ;;
                --pid) PID=$2 ;;
                --root) ROOT=$2 ;;  # tests: a directory laid out like a host
            esac
            shift ;;
        *) usage "$arg: unknown option" ;;
    esac
    shift
done
ROOT=${ROOT%/}
[ -n "$NAME" ] || NAME=$(uname -n 2>/dev/null)
[ -n "$NAME" ] || NAME=host
case $NAME in
    */* | . | ..) usage "--name: '$NAME' is not a usable directory name" ;;
esac
if [ -n "$PID" ]; then
    case $PID in
        '' | *[!0-9]* | 0*) usage "--pid: '$PID' is not a process id" ;;
    esac
    [ ${#PID} -le 10 ] || usage "--pid: '$PID' is not a process id"
    [ -d "$ROOT/proc/$PID" ] || usage "--pid $PID: no such process"
    PROC=/proc/$PID
else
    PROC=/proc/self
fi
[ -n "$OUT" ] || OUT=$NAME.tar.gz

cannot() {  # why: the one line, exit 73
    printf '%s: -o %s: %s\n' "$PROG" "$OUT" "$1" >&2
    exit 73
}

# -o: stdout (not a terminal), a new file in a writable directory or a regular file (replaced);
# never through or over a symbolic link, a directory, a device, a FIFO or a socket. Checked
# before any collecting and again just before the tarball is moved into place.
case $OUT in
    */*) OUTDIR=${OUT%/*}; [ -n "$OUTDIR" ] || OUTDIR=/ ;;
    *) OUTDIR=. ;;
esac
check_output() {
    if [ "$OUT" = - ]; then
        [ ! -t 1 ] || cannot "stdout is a terminal; redirect it to a file (-o - > host.tar.gz)"
        return 0
    fi
    what=
    if [ -L "$OUT" ]; then what="a symbolic link"
    elif [ -d "$OUT" ]; then what="a directory"
    elif [ -c "$OUT" ]; then what="a character device"
    elif [ -b "$OUT" ]; then what="a block device"
    elif [ -p "$OUT" ]; then what="a FIFO"
    elif [ -S "$OUT" ]; then what="a socket"
    elif [ -e "$OUT" ] && [ ! -f "$OUT" ]; then what="not a file"
    fi
    [ -z "$what" ] || cannot "$what, not a regular file: refused (-o - writes to stdout)"
    [ ! -f "$OUT" ] || return 0
    if [ ! -e "$OUTDIR" ]; then cannot "cannot write: No such file or directory"; fi
    if [ ! -d "$OUTDIR" ]; then cannot "cannot write: Not a directory"; fi
    if [ ! -w "$OUTDIR" ] || [ ! -x "$OUTDIR" ]; then cannot "cannot write: Permission denied"; fi
}
check_output

USER_UMASK=$(umask)
TMP=${TMPDIR:-/tmp}/umbp-sim-collect.$$
STAGE=
cleanup() {
    rm -rf "$TMP"
    [ -z "$STAGE" ] || rm -rf "$STAGE"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
umask 077
mkdir "$TMP" || { printf '%s: cannot create %s\n' "$PROG" "$TMP" >&2; exit 73; }
umask 022
DUMP=$TMP/$NAME
mkdir "$DUMP"
: >"$TMP/collected"
: >"$TMP/missing"
: >"$TMP/notes"

missing() {  # rel reason
    printf '%s\t%s\n' "$1" "$2" >>"$TMP/missing"
}

why() {  # host path -> the reason it cannot be read
    if [ ! -e "$1" ]; then
        printf 'No such file or directory'
    elif [ ! -r "$1" ]; then
        printf 'Permission denied'
    else
        printf 'cannot be read'
    fi
}

add() {  # rel < data
    mkdir -p "$DUMP/$(dirname "$1")"
    cat >"$DUMP/$1"
    printf '%s\n' "$1" >>"$TMP/collected"
}

copy() {  # host path [rel]; status 1 when it cannot be read
    src=$ROOT$1
    rel=${2:-${1#/}}
    mkdir -p "$DUMP/$(dirname "$rel")"
    if [ -f "$src" ] && cat "$src" >"$DUMP/$rel" 2>/dev/null; then
        printf '%s\n' "$rel" >>"$TMP/collected"
        return 0
    fi
    rm -f "$DUMP/$rel"
    missing "$rel" "$(why "$src")"
    return 1
}

copy_tree() {  # every readable regular file under a host directory (no links, no write-only)
    if [ ! -d "$ROOT$1" ]; then
        missing "${1#/}" "$(why "$ROOT$1")"
        return
    fi
    find "$ROOT$1" -type f \( -perm -0400 -o -perm -0040 -o -perm -0004 \) -print |
        while IFS= read -r f; do
            copy "${f#"$ROOT"}"
        done
}

# ---- the files of a dump -----------------------------------------------------------------------
# BEGIN generated by tools/generated.py from collect.py's declaration: do not edit
PROC_FILES="meminfo zoneinfo"
VM_SYSCTLS="min_free_kbytes nr_hugepages nr_overcommit_hugepages overcommit_memory overcommit_ratio overcommit_kbytes admin_reserve_kbytes user_reserve_kbytes"
NODE_LISTS="online possible has_memory"
NODE_FILES="meminfo cpulist distance"
# END generated

# ---- memory, sysctls, kernel, limits --------------------------------------------------------
for key in $PROC_FILES; do
    copy "/proc/$key"
done
for key in $VM_SYSCTLS; do
    copy "/proc/sys/vm/$key"
done
if ! copy /proc/sys/kernel/osrelease && [ -z "$ROOT" ]; then
    uname -r | add proc/sys/kernel/osrelease
    grep -v "^proc/sys/kernel/osrelease$TAB" "$TMP/missing" >"$TMP/missing.new"
    mv "$TMP/missing.new" "$TMP/missing"
    echo "proc/sys/kernel/osrelease: from uname()" >>"$TMP/notes"
fi
copy "$PROC/limits" proc/self/limits
[ -z "$PID" ] || echo "proc/self/limits: from /proc/$PID/limits (the server process)" >>"$TMP/notes"

# ---- hugepages and NUMA nodes ---------------------------------------------------------------
copy_tree /sys/kernel/mm/hugepages
NODE=/sys/devices/system/node
for key in $NODE_LISTS; do
    copy "$NODE/$key"
done
if [ -d "$ROOT$NODE" ]; then
    for d in "$ROOT$NODE"/node*; do
        n=${d##*/}
        case ${n#node} in '' | *[!0-9]*) continue ;; esac
        for key in $NODE_FILES; do
            copy "$NODE/$n/$key"
        done
        copy_tree "$NODE/$n/hugepages"
    done
else
    missing "${NODE#/}" "$(why "$ROOT$NODE")"
fi

# ---- cgroup limits: the smallest along the path from the process's cgroup to the root -------
V2_PATH=
V1_MEMORY=
V1_HUGETLB=
if [ -r "$ROOT$PROC/cgroup" ]; then
    while IFS=: read -r hid ctrls path; do
        if [ "$hid" = 0 ] && [ -z "$ctrls" ]; then
            V2_PATH=$path
        else
            case ",$ctrls," in *,memory,*) V1_MEMORY=$path ;; esac
            case ",$ctrls," in *,hugetlb,*) V1_HUGETLB=$path ;; esac
        fi
    done <"$ROOT$PROC/cgroup"
fi
V2_MOUNT=
M_MEMORY=
M_HUGETLB=
if [ -r "$ROOT$PROC/mountinfo" ]; then
    while IFS= read -r line; do
        left=${line%% - *}
        right=${line#* - }
        [ "$left" != "$line" ] || continue
        # shellcheck disable=SC2086
        set -- $left
        [ $# -ge 5 ] || continue
        mnt=$5
        # shellcheck disable=SC2086
        set -- $right
        [ $# -ge 3 ] || continue
        if [ "$1" = cgroup2 ] && [ -z "$V2_MOUNT" ]; then
            V2_MOUNT=$mnt
        elif [ "$1" = cgroup ]; then
            case ",$3," in *,memory,*) [ -n "$M_MEMORY" ] || M_MEMORY=$mnt ;; esac
            case ",$3," in *,hugetlb,*) [ -n "$M_HUGETLB" ] || M_HUGETLB=$mnt ;; esac
        fi
    done <"$ROOT$PROC/mountinfo"
fi

read_limit() {  # file -> "max", a number, or "" (absent or not a limit)
    v=$(cat "$ROOT$1" 2>/dev/null) || { echo; return; }
    v=$(printf '%s' "$v" | tr -d ' \t\n')
    case $v in
        max) echo max ;;
        '' | *[!0-9]*) echo ;;
        *)
            v=$(printf '%s' "$v" | sed 's/^0*//')
            [ -n "$v" ] || v=0
            if [ ${#v} -gt 18 ] || [ "$v" -ge 4611686018427387904 ]; then echo max; else echo "$v"; fi ;;
    esac
}

effective() {  # mount cgroup-path file -> "value level" (the binding one), or nothing
    best=
    level=$2
    level=${level%/}
    [ -n "$level" ] || level=/
    while :; do
        if [ "$level" = / ]; then f=$1/$3; else f=$1$level/$3; fi
        v=$(read_limit "$f")
        if [ -n "$v" ]; then
            if [ -z "$best" ]; then
                best=$v; at=$level
            elif [ "$v" != max ] && { [ "$best" = max ] || [ "$v" -lt "$best" ]; }; then
                best=$v; at=$level
            fi
        fi
        [ "$level" != / ] || break
        level=${level%/*}
        [ -n "$level" ] || level=/
    done
    [ -z "$best" ] || printf '%s %s\n' "$best" "$at"
}

limit() {  # v2-name controller v1-name
    rel=sys/fs/cgroup/$1
    found=
    how=
    if [ -n "$V2_PATH" ] && [ -n "$V2_MOUNT" ]; then
        found=$(effective "$V2_MOUNT" "$V2_PATH" "$1")
        how="cgroup v2 $V2_PATH"
    fi
    if [ -z "$found" ]; then
        if [ "$2" = memory ]; then p=$V1_MEMORY; m=$M_MEMORY; else p=$V1_HUGETLB; m=$M_HUGETLB; fi
        if [ -n "$p" ] && [ -n "$m" ]; then
            found=$(effective "$m" "$p" "$3")
            how="cgroup v1 $2:$p $3"
        fi
    fi
    if [ -z "$found" ]; then
        missing "$rel" "no such limit file in the current cgroup or its parents"
        return
    fi
    echo "${found%% *}" | add "$rel"
    echo "$rel: from $how (binding level ${found#* })" >>"$TMP/notes"
}

limit memory.max memory memory.limit_in_bytes
for d in "$ROOT"/sys/kernel/mm/hugepages/hugepages-*kB; do
    kb=${d##*/hugepages-}
    kb=${kb%kB}
    case $kb in '' | *[!0-9]*) continue ;; esac
    if [ "$kb" -ge 1048576 ]; then
        n=$((kb / 1048576))GB
    elif [ "$kb" -ge 1024 ]; then
        n=$((kb / 1024))MB
    else
        n=${kb}KB
    fi
    printf '%s %s\n' "$kb" "$n"
done | sort -n | while read -r kb n; do
    limit "hugetlb.$n.max" hugetlb "hugetlb.$n.limit_in_bytes"
    limit "hugetlb.$n.rsvd.max" hugetlb "hugetlb.$n.rsvd.limit_in_bytes" # reservations (5.7+)
done

# ---- what the server process saw -------------------------------------------------------------
LEFT_OUT="environment variables (/proc/*/environ): never read
command lines (/proc/*/cmdline): never read"
if [ -n "$PID" ]; then
    S=proc/$PID
    copy "/proc/$PID/limits" "$S/limits"
    copy "/proc/$PID/cgroup" "$S/cgroup"
    if [ -r "$ROOT/proc/$PID/status" ]; then
        grep -E '^(Mems_allowed|Mems_allowed_list|Cpus_allowed|Cpus_allowed_list):' \
            "$ROOT/proc/$PID/status" | add "$S/status"
    else
        missing "$S/status" "$(why "$ROOT/proc/$PID/status")"
    fi
    if [ -r "$ROOT/proc/$PID/numa_maps" ]; then
        awk 'NF >= 2 {
            out = $1 " " $2
            for (i = 3; i <= NF; i++)
                if ($i ~ /^(N[0-9]+|anon|dirty|active|mapped|mapmax|swapcache|writeback|kernelpagesize_kB)=[0-9]+$/ || $i ~ /^(huge|heap|stack)$/)
                    out = out " " $i
            print out
        }' "$ROOT/proc/$PID/numa_maps" | add "$S/numa_maps"
    else
        missing "$S/numa_maps" "$(why "$ROOT/proc/$PID/numa_maps")"
    fi
    echo "cgroup limits: of /proc/$PID/cgroup (the server process)" >>"$TMP/notes"
    LEFT_OUT="$LEFT_OUT
$S/status: all but Mems_allowed, Mems_allowed_list, Cpus_allowed, Cpus_allowed_list
$S/numa_maps: file names"
fi

# ---- the manifest ------------------------------------------------------------------------------
esc() { printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g'; }
list() {  # JSON array body from lines on stdin
    sep=
    while IFS= read -r item; do
        printf '%s\n  "%s"' "$sep" "$(esc "$item")"
        sep=,
    done
    [ -z "$sep" ] || printf '\n '
}
{
    printf '{\n "tool": "umbp-sim collect.sh",\n "name": "%s",\n' "$(esc "$NAME")"
    printf ' "time": "%s",\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    printf ' "pid": %s,\n' "${PID:-null}"
    if [ -z "$ROOT" ]; then  # this host's architecture and page size (not a --root tree's)
        MACH=$(uname -m 2>/dev/null)
        PAGE=$(getconf PAGESIZE 2>/dev/null)
        [ -z "$MACH" ] || printf ' "machine": "%s",\n' "$(esc "$MACH")"
        case $PAGE in '' | *[!0-9]*) ;; *) printf ' "page_size": %s,\n' "$PAGE" ;; esac
    fi
    printf ' "collected": ['
    LC_ALL=C sort -u "$TMP/collected" | list
    printf '],\n "files": {'
    # every file and its size in bytes: the reader names what a cut-short copy lost
    LC_ALL=C sort -u "$TMP/collected" | {
        sep=
        while IFS= read -r k; do
            printf '%s\n  "%s": %s' "$sep" "$(esc "$k")" "$(wc -c <"$DUMP/$k" | tr -d ' ')"
            sep=,
        done
        [ -z "$sep" ] || printf '\n '
    }
    printf '},\n "missing": {'
    sep=
    # the last reason given for a path wins, as in a dict
    awk -F "$TAB" '{ r[$1] = $2 } END { for (k in r) print k "\t" r[k] }' "$TMP/missing" |
        LC_ALL=C sort | {
        while IFS="$TAB" read -r k r; do
            printf '%s\n  "%s": "%s"' "$sep" "$(esc "$k")" "$(esc "$r")"
            sep=,
        done
        [ -z "$sep" ] || printf '\n '
    }
    printf '},\n "left_out": ['
    printf '%s\n' "$LEFT_OUT" | list
    printf '],\n "notes": ['
    list <"$TMP/notes"
    printf ']\n}\n'
} >"$DUMP/$MANIFEST"

# ---- the tarball -------------------------------------------------------------------------------
case $OUT in
    *.gz | *.tgz) ZIP="gzip -c" ;;
    *.bz2 | *.tbz2) ZIP="bzip2 -c" ;;
    *.xz | *.txz) ZIP="xz -c" ;;
    *) ZIP=cat ;;
esac
# the manifest first: a copy cut short still says what it lost
(cd "$TMP" && find "$NAME" -type f ! -path "$NAME/$MANIFEST" -print | LC_ALL=C sort) >"$TMP/list"
set -- "$NAME/$MANIFEST"
while IFS= read -r f; do set -- "$@" "$f"; done <"$TMP/list"
(cd "$TMP" && tar -cf - "$@") >"$TMP/dump.tar" 2>/dev/null || cannot "cannot write: tar failed"
n=$(wc -l <"$TMP/collected" | tr -d ' ')
m=$(awk -F "$TAB" '!seen[$1]++ { n++ } END { print n + 0 }' "$TMP/missing")
if [ "$OUT" = - ]; then
    check_output
    gzip -c <"$TMP/dump.tar" || cannot "cannot write"
    WROTE="the tarball to stdout"
else
    # A private directory beside OUT (mkdir fails on anything already there), the tarball
    # made in it with the caller's umask, then moved into place over a new or regular file.
    umask 077
    mkdir "$OUTDIR/.umbp-sim-collect.$$" 2>/dev/null || cannot "cannot write: Permission denied"
    STAGE=$OUTDIR/.umbp-sim-collect.$$
    umask "$USER_UMASK"
    $ZIP <"$TMP/dump.tar" 2>/dev/null >"$STAGE/part" && [ -s "$STAGE/part" ] ||
        cannot "cannot write"
    check_output
    mv -f "$STAGE/part" "$OUT" 2>/dev/null || cannot "cannot write"
    WROTE=$OUT
fi
printf 'wrote %s: %s/, %s files, %s missing (listed in %s/%s)\n' \
    "$WROTE" "$NAME" "$n" "$m" "$NAME" "$MANIFEST" >&2
exit 0
