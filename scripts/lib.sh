# Shared shell helpers for the project's scripts. Source it; do not run it.

repo_root() { cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd; }

# release_build [PRODUCT]: PRODUCT (default guidedaccessd) built as the
# Makefile builds what ships (`make build`: release, Swift standard library
# linked in, no _StringProcessing), so benchmarks measure that and every
# release build shares one set of compiled modules. Quiet unless it fails;
# the binary is then in $(swift build -c release --show-bin-path).
release_build() {
    local log
    log=$(make -s -C "$(repo_root)" build PRODUCT="${1:-guidedaccessd}" 2>&1) || {
        echo "$log" >&2
        echo "release_build: make build PRODUCT=${1:-guidedaccessd} failed" >&2
        return 1
    }
}

# start_private_bus DIR [TYPE [LINES]]: a dbus-daemon of our own on DIR/bus,
# with a policy that admits any user, and LINES of configuration added (say,
# <limit> elements); sets BUS_ADDRESS and BUS_PID.
start_private_bus() {
    local dir=$1 type=${2:-session} lines=${3:-}
    sed -e "s|@TYPE@|$type|" -e "s|@SOCKET@|$dir/bus|" "$(repo_root)/Tests/integration/bus.conf.in" > "$dir/bus.conf"
    if [ -n "$lines" ]; then
        BUS_LINES=$lines awk '/<\/busconfig>/ { print ENVIRON["BUS_LINES"] } { print }' "$dir/bus.conf" > "$dir/bus.conf.new"
        mv "$dir/bus.conf.new" "$dir/bus.conf"
    fi
    local out
    out=$(dbus-daemon --config-file="$dir/bus.conf" --fork --print-address=1 --print-pid=1)
    BUS_ADDRESS=$(sed -n 1p <<<"$out")
    BUS_PID=$(sed -n 2p <<<"$out")
}

# wait_for_line FILE PATTERN SECONDS
wait_for_line() {
    local file=$1 pattern=$2 seconds=$3 i
    for ((i = 0; i < seconds * 20; i++)); do
        grep -q "$pattern" "$file" 2>/dev/null && return 0
        sleep 0.05
    done
    echo "timed out waiting for '$pattern' in $file" >&2
    return 1
}
