#!/usr/bin/env bash
# Fake nodes on one machine, to try llmhpc's multi-node path (mpirun over a hostfile, TCP between
# nodes and shared memory within one, a report's nodes) without a cluster. Node I is a network
# namespace whose veth pair's other end sits on a bridge in a namespace of its own (10.77.0.0/24,
# node I at 10.77.0.<11+I>, no route out: traffic stays among the nodes), with its own UTS
# namespace (hostname nodeI) and mount namespace (a private tmpfs on /dev/shm, so Open MPI's
# shared-memory transport cannot cross nodes; /etc/hosts naming the nodes; a private tmpfs on
# DIR/nodetmp, the node's scratch space), pinned to one core (taskset: node I on core I mod the
# CPUs this script may run on).
# One process per node, its holder, keeps the namespaces; commands enter them with nsenter, and
# Open MPI reaches a node through DIR/agent (its plm_rsh_agent, in place of ssh).
#   scripts/fake_nodes.sh up N DIR          nodes node0..node{N-1} (N from 1 to 244), their state
#                                           in DIR (not holding another up's files); prints how to use them
#   scripts/fake_nodes.sh run I DIR CMD...  CMD in node I (its namespaces, its core), from DIR
#   scripts/fake_nodes.sh pids I DIR [NAME] the processes in node I (named NAME), a pid a line:
#                                           kill -STOP $(... pids 1 DIR llmhpc) hangs node1's ranks
#   scripts/fake_nodes.sh down DIR          kills whatever runs in the nodes, deletes them and the
#                                           files up wrote in DIR (what else is there stays)
#   scripts/fake_nodes.sh sweep             deletes the nodes no folder holds any more (DIR deleted
#                                           before down, or an up killed outright)
# DIR holds node<I>.pid (the holders), hosts (the nodes' /etc/hosts), nodes (name, address and core
# of each), netns (the namespaces), agent, and hostfile: `DIR/hostfile 2 1` writes a hostfile of
# node0 with 2 slots and node1 with 1 and prints its path (no argument: one slot on every node).
# Namespaces are named llmhpc-fn<PID>-br (the bridge) and llmhpc-fn<PID>-<I>, PID their owner's: a
# process of up's that lives until down. Where the owner is gone, the namespaces are the leftovers
# of a run killed outright; fake_nodes_sweep removes them.
# Sourced (tests/scripts/test_fake_nodes.sh does), this file only defines functions and settings:
# fake_nodes_up, fake_nodes_check, fake_nodes_run, in_node, fake_nodes_down, fake_nodes_sweep, ...;
# they return non-zero with the reason in FAKE_NODES_ERROR, and leave exiting to the caller.
# Needs root, iproute2, util-linux (unshare, nsenter, setsid, taskset), veth and bridge devices.
# Not scripts/fake_hosts.sh, which leaves MPI on one node and makes NCCL alone see each GPU's rank
# as a host of its own.

FAKE_NODES_SUBNET=10.77.0.0/24
FAKE_NODES_MAX=244  # node I at 10.77.0.<11+I>, up to .254
FAKE_NODES_ERROR=""
FAKE_NODES_DIR=""   # the folder of the nodes fake_nodes_up made last: in_node's

fake_nodes_addr() { echo "10.77.0.$((11 + $1))"; }  # fake_nodes_addr I: node I's address

# fake_nodes_args N DIR: returns 2 (FAKE_NODES_ERROR says why) unless N is a number of nodes that
# fits the subnet and DIR a folder that the nodes can see and that holds no nodes yet; DIR's
# absolute path in FAKE_NODES_ARG_DIR.
fake_nodes_args() {
  local n=${1:-} dir=${2:-}
  if ! [[ "$n" =~ ^[0-9]+$ ]] || [ $((10#$n)) -lt 1 ] || [ $((10#$n)) -gt $FAKE_NODES_MAX ]; then
    FAKE_NODES_ERROR="N must be a number of nodes from 1 to $FAKE_NODES_MAX (what $FAKE_NODES_SUBNET holds from .11 on), not '$n'"
    return 2
  fi
  [ -n "$dir" ] || { FAKE_NODES_ERROR="no DIR: give a folder for the nodes' state, such as /tmp/nodes"; return 2; }
  dir=$(realpath -m -- "$dir")
  if ! [[ "$dir" =~ ^/[A-Za-z0-9._/+-]*$ ]]; then
    FAKE_NODES_ERROR="DIR $dir: use a path of letters, digits and . _ + - / only (Open MPI splits its agent's path at spaces)"
    return 2
  fi
  case $dir/ in
    /dev/shm/*) FAKE_NODES_ERROR="DIR $dir is under /dev/shm, which each node has of its own: take one the nodes can see, such as /tmp/nodes"
      return 2 ;;
  esac
  if [ -e "$dir/netns" ]; then
    FAKE_NODES_ERROR="$dir already holds fake nodes ($(paste -sd ' ' "$dir/netns" 2>/dev/null)): run 'scripts/fake_nodes.sh down $dir' first, or give another folder"
    return 2
  fi
  if [ -e "$dir" ] && [ ! -d "$dir" ]; then
    FAKE_NODES_ERROR="DIR $dir is a file, not a folder: give a folder for the nodes' state"
    return 2
  fi
  FAKE_NODES_ARG_DIR=$dir
}

# The holder of node I, run by sh in the node's new UTS and mount namespaces (and its network
# namespace) as `sh -c "$FAKE_NODES_HOLDER" holder DIR I`. In its mount namespace: a sysfs of the
# node's network (as ip netns exec mounts), the host's cgroups kept over it (slurmd wants them),
# its own /dev/shm, /etc/hosts and DIR/nodetmp. It says its pid in DIR/nodeI.pid once all is there.
# shellcheck disable=SC2016  # expanded by the holder's sh
FAKE_NODES_HOLDER='
set -e
dir=$1 i=$2
hostname "node$i"
cgroups=0
if mountpoint -q /sys/fs/cgroup; then mount --rbind /sys/fs/cgroup "$dir/cgroup$i"; cgroups=1; fi
mount -t sysfs sysfs /sys
if [ $cgroups = 1 ]; then mount --move "$dir/cgroup$i" /sys/fs/cgroup; fi
mount -t tmpfs -o size=256m,mode=1777 tmpfs /dev/shm
mount --bind "$dir/hosts" /etc/hosts
mount -t tmpfs -o size=256m,mode=1777 tmpfs "$dir/nodetmp"
echo $$ >"$dir/node$i.pid.new"
mv "$dir/node$i.pid.new" "$dir/node$i.pid"
exec sleep infinity'

# fake_nodes_up N DIR [OWNER]: nodes node0..node{N-1} with their state in DIR (made where new),
# namespaces llmhpc-fn<OWNER>-... (OWNER: a pid that lives as long as the nodes, by default this
# shell's). Returns 0; 2 where N or DIR are wrong; 1 where this machine cannot make
# them (no root, namespaces, veth or bridge devices). What it made before failing is in DIR/netns,
# for fake_nodes_down.
fake_nodes_up() {
  local n dir owner=${3:-$$} tag bridge cores ns i out tool
  FAKE_NODES_ERROR=""
  fake_nodes_args "${1:-}" "${2:-}" || return 2
  n=$((10#$1)) dir=$FAKE_NODES_ARG_DIR
  [[ "$owner" =~ ^[1-9][0-9]*$ ]] || { FAKE_NODES_ERROR="OWNER must be a pid, not '$owner'"; return 2; }
  [ "$(id -u)" = 0 ] || { FAKE_NODES_ERROR="making network, UTS and mount namespaces needs root: run it as root (sudo)"; return 1; }
  for tool in ip unshare nsenter setsid taskset mountpoint; do
    command -v "$tool" >/dev/null ||
      { FAKE_NODES_ERROR="no $tool here: install iproute2 and util-linux (make deps)"; return 1; }
  done
  mkdir -p "$dir/nodetmp" || { FAKE_NODES_ERROR="could not make the folder $dir"; return 2; }
  FAKE_NODES_DIR=$dir
  tag=llmhpc-fn$owner
  bridge=$tag-br
  # The CPUs this process may run on: nproc alone would answer OMP_NUM_THREADS where it is set (as
  # ctest sets it for the tests), and every node would sit on core 0 (launches 0.6 -> 0.85 s).
  cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
  {
    echo "127.0.0.1 localhost"
    for ((i = 0; i < n; i++)); do echo "$(fake_nodes_addr $i) node$i"; done
  } >"$dir/hosts"
  for ((i = 0; i < n; i++)); do echo "node$i $(fake_nodes_addr $i) $((i % cores))"; done >"$dir/nodes"
  # Each namespace is listed in DIR/netns before it is made (and unlisted should that fail), so
  # that fake_nodes_down finds it whenever this stops.
  echo "$bridge" >"$dir/netns"
  out=$(ip netns add "$bridge" 2>&1) || {
    sed -i '$d' "$dir/netns"
    FAKE_NODES_ERROR="ip netns add failed: no network namespaces here ($out)"
    return 1
  }
  out=$(ip -n "$bridge" link add br0 type bridge 2>&1) ||
    { FAKE_NODES_ERROR="no bridge devices here (kernel module bridge: modprobe bridge) ($out)"; return 1; }
  out=$(ip -n "$bridge" link set br0 up 2>&1) || { FAKE_NODES_ERROR="the bridge could not be set up ($out)"; return 1; }
  for ((i = 0; i < n; i++)); do
    ns=$tag-$i
    echo "$ns" >>"$dir/netns"
    out=$(ip netns add "$ns" 2>&1) ||
      { sed -i '$d' "$dir/netns"; FAKE_NODES_ERROR="ip netns add $ns failed ($out)"; return 1; }
    # IPv4 only: no IPv6 link-local addresses for Open MPI to try besides the subnet.
    # shellcheck disable=SC2016  # expanded by sh
    ip netns exec "$ns" sh -c 'for c in all default; do echo 1 >/proc/sys/net/ipv6/conf/$c/disable_ipv6; done' \
      2>/dev/null || true
    out=$(ip -n "$ns" link add eth0 type veth peer name "p$i" netns "$bridge" 2>&1) ||
      { FAKE_NODES_ERROR="no veth devices here (kernel module veth: modprobe veth) ($out)"; return 1; }
    out=$({ ip -n "$bridge" link set "p$i" master br0 && ip -n "$bridge" link set "p$i" up &&
      ip -n "$ns" addr add "$(fake_nodes_addr $i)/24" dev eth0 && ip -n "$ns" link set eth0 up &&
      ip -n "$ns" link set lo up; } 2>&1) ||
      { FAKE_NODES_ERROR="node$i's network could not be set up ($out)"; return 1; }
    mkdir -p "$dir/cgroup$i"
    # The holder, detached from the terminal (setsid: its Ctrl-C and hang-up leave it alone), no
    # descriptor of the caller's kept open; killed by fake_nodes_down.
    setsid nsenter --net="/run/netns/$ns" -- taskset -c $((i % cores)) \
      unshare --uts --mount --propagation private -- sh -c "$FAKE_NODES_HOLDER" holder "$dir" "$i" \
      </dev/null >"$dir/holder$i.log" 2>&1 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&- &
    disown
  done
  for ((i = 0; i < n; i++)); do
    for _ in $(seq 50); do [ -f "$dir/node$i.pid" ] && break; sleep 0.1; done
    [ -f "$dir/node$i.pid" ] ||
      { FAKE_NODES_ERROR="node$i's namespaces could not be made: $(cat "$dir/holder$i.log")"; return 1; }
  done
  # Open MPI's plm_rsh_agent, in place of ssh.
  cat >"$dir/agent" <<AGENT
#!/usr/bin/env bash
# Open MPI's plm_rsh_agent for the fake nodes of $dir (scripts/fake_nodes.sh): AGENT [options]
# HOST COMMAND...: COMMAND (one shell line, as ssh runs it) in fake node HOST's namespaces, on its core
# (HOST: nodeI, or its address, as a hostfile may name it).
while [[ "\${1:-}" == -* ]]; do shift; done
host=\$1
shift
i=\${host#node}
[[ "\$i" =~ ^[0-9]+\$ ]] || i=\$(awk -v h="\$host" '\$2 == h { sub("node", "", \$1); print \$1 }' "$dir/nodes")
[[ "\$i" =~ ^[0-9]+\$ ]] && [ -f "$dir/node\$i.pid" ] ||
  { echo "\$0: no fake node '\$host' in $dir (node0..node$((n - 1)) are, or their addresses in $dir/nodes)" >&2; exit 255; }
exec nsenter -t "\$(cat "$dir/node\$i.pid")" --net --uts --mount --wd="$dir" -- taskset -c \$((i % $cores)) sh -c "\$*"
AGENT
  cat >"$dir/hostfile" <<HOSTFILE
#!/usr/bin/env bash
# hostfile [SLOTS...]: a hostfile of node0 with SLOTS[0] slots, node1 with SLOTS[1], ... (no SLOTS:
# one slot on each of the $n fake nodes of $dir), written as $dir/hosts-S0-S1-...; prints its path.
# mpirun --hostfile "\$($dir/hostfile 2 1)" -np 3 ...
set -euo pipefail
[ \$# -gt 0 ] || set -- \$(for ((i = 0; i < $n; i++)); do echo 1; done)
[ \$# -le $n ] || { echo "\$0: \$# slot counts for $n fake nodes: give at most $n" >&2; exit 2; }
for s in "\$@"; do
  [[ "\$s" =~ ^[1-9][0-9]*\$ ]] || { echo "\$0: slot counts are whole numbers >= 1, not '\$s'" >&2; exit 2; }
done
f=$dir/hosts-\$(IFS=-; echo "\$*")
i=0
# Written aside and renamed: two launches at once must not read the other's half-written file.
for s in "\$@"; do echo "node\$i slots=\$s"; i=\$((i + 1)); done >"\$f.\$\$"
mv -f "\$f.\$\$" "\$f"
echo "\$f"
HOSTFILE
  chmod 755 "$dir/agent" "$dir/hostfile"
}

# fake_nodes_netns DIR I: node I's network namespace (the bridge's name, DIR/netns' first line,
# with -I for -br).
fake_nodes_netns() {
  local first
  first=$(sed -n 1p "$1/netns")
  echo "${first%-br}-$2"
}

# fake_nodes_run I DIR COMMAND...: COMMAND in node I's namespaces, on its core, from DIR.
fake_nodes_run() {
  local i=$1 dir=$2 core
  shift 2
  core=$(awk -v n="node$i" '$1 == n { print $3 }' "$dir/nodes")
  nsenter -t "$(cat "$dir/node$i.pid")" --net --uts --mount --wd="$dir" -- taskset -c "$core" "$@"
}
# fake_nodes_pids I DIR [NAME]: the processes in node I's network namespace (named NAME, as
# /proc/PID/comm has it: its first 15 characters), a pid a line; the holder of the namespaces is
# left out.
fake_nodes_pids() {
  local pid holder name=${3:-}
  holder=$(cat "$2/node$1.pid" 2>/dev/null)
  for pid in $(ip netns pids "$(fake_nodes_netns "$2" "$1")" 2>/dev/null); do
    [ "$pid" = "$holder" ] && continue
    [ -z "$name" ] || [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "${name:0:15}" ] && echo "$pid"
  done
  return 0
}
# in_node I COMMAND...: the same in the nodes fake_nodes_up made last.
in_node() { fake_nodes_run "$1" "$FAKE_NODES_DIR" "${@:2}"; }

# fake_nodes_check DIR: returns 1 (FAKE_NODES_ERROR says why) unless each node has its hostname,
# its own /dev/shm, and reaches the next node by name.
fake_nodes_check() {
  local dir=$1 n i peer tag out
  n=$(wc -l <"$dir/nodes")
  tag=$(head -n 1 "$dir/netns")
  tag=${tag%-br}
  for ((i = 0; i < n; i++)); do
    out=$(fake_nodes_run $i "$dir" hostname 2>&1) || true
    [ "$out" = "node$i" ] || { FAKE_NODES_ERROR="node$i's hostname is '$out'"; return 1; }
    touch "/dev/shm/$tag-host"
    fake_nodes_run $i "$dir" touch "/dev/shm/$tag-node$i"
    if [ -e "/dev/shm/$tag-node$i" ] || ! fake_nodes_run $i "$dir" test ! -e "/dev/shm/$tag-host"; then
      rm -f "/dev/shm/$tag-host" "/dev/shm/$tag-node$i"
      FAKE_NODES_ERROR="node$i's /dev/shm is not its own"
      return 1
    fi
    rm -f "/dev/shm/$tag-host"
    fake_nodes_run $i "$dir" rm -f "/dev/shm/$tag-node$i"
    # Nothing listens on port 9 (discard): a refused connection is an answer from the peer.
    peer=node$(((i + 1) % n))
    # shellcheck disable=SC2016  # expanded by the inner bash
    out=$(fake_nodes_run $i "$dir" env LC_ALL=C timeout 3 bash -c 'exec 3<>"/dev/tcp/$1/9"' reach "$peer" 2>&1) || true
    [[ "$out" == *"Connection refused"* ]] ||
      { FAKE_NODES_ERROR="node$i cannot reach $peer (${out:-no answer within 3 s})"; return 1; }
  done
}

# fake_nodes_down DIR: kills whatever runs in the namespaces of DIR/netns (the holders, ranks,
# orted, daemons: all are in them), deletes them, and DIR/netns and the holders' pid files with
# them. Returns 1 (FAKE_NODES_ERROR says which) where a namespace could not be deleted; 0 where
# there is nothing to do, so it can run twice.
fake_nodes_down() {
  local dir=$1 ns pid list=() left=()
  [ -f "$dir/netns" ] || return 0
  mapfile -t list <"$dir/netns"
  for ns in "${list[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
  done
  for ns in "${list[@]}"; do
    for _ in 1 2 3 4 5 6 7 8 9 10; do [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break; sleep 0.2; done
    ip netns del "$ns" 2>/dev/null
    [ -e "/run/netns/$ns" ] && left+=("$ns")
  done
  if [ ${#left[@]} -gt 0 ]; then
    FAKE_NODES_ERROR="could not delete the namespace(s) ${left[*]} (still in use? ip netns pids NAME says by whom)"
    return 1
  fi
  rm -f "$dir/netns" "$dir"/node*.pid "$dir"/node*.pid.new
}

# fake_nodes_sweep [--lost-folders]: deletes the namespaces llmhpc-fn<PID>-... whose owner PID is
# gone, with whatever still runs in them (the leftovers of a run killed outright); prints their
# names. --lost-folders: also those of an up whose folder was deleted (its owner, named after the
# folder, lives on; the owner is killed too). Not while an up is making nodes: until up has
# written DIR/netns its nodes look lost.
fake_nodes_sweep() {
  local ns owner pid name gone=()
  for ns in $(ip netns list 2>/dev/null | grep -o '^llmhpc-fn[0-9]*-[a-z0-9]*'); do
    owner=${ns#llmhpc-fn}
    owner=${owner%%-*}
    name=$(tr '\0' '\n' 2>/dev/null <"/proc/$owner/cmdline" | head -n 1)  # empty: gone (or a zombie)
    if [ -n "$name" ]; then
      [ "${1:-}" = --lost-folders ] || continue
      # Only up's owner ("llmhpc-fake-nodes DIR"), and only where DIR no longer lists this namespace.
      [[ "$name" == "llmhpc-fake-nodes "* ]] || continue
      grep -qx "$ns" "${name#llmhpc-fake-nodes }/netns" 2>/dev/null && continue
      kill "$owner" 2>/dev/null || true
    fi
    gone+=("$ns")
  done
  # As fake_nodes_down: every process in them killed, then each deleted once it is empty.
  for ns in "${gone[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
  done
  for ns in "${gone[@]}"; do
    for _ in 1 2 3 4 5 6 7 8 9 10; do [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break; sleep 0.2; done
    ip netns del "$ns" 2>/dev/null && echo "$ns"
  done
  return 0
}

# ---- the command line ----
fake_nodes_usage() {
  cat <<USAGE
usage: $0 up N DIR | run I DIR COMMAND... | pids I DIR [NAME] | down DIR | sweep | --help
Fake nodes node0..node{N-1} on one machine (as root): network, UTS and mount namespaces on a
bridge ($FAKE_NODES_SUBNET, node I at 10.77.0.<11+I>), each with its hostname, /etc/hosts,
/dev/shm and one core, for mpirun across hosts without a cluster.
  up N DIR          make N nodes (1 to $FAKE_NODES_MAX), their state in DIR (not holding another up's
                    files); prints how to use them
  run I DIR CMD...  CMD in node I (its namespaces and core), from DIR
  pids I DIR [NAME] the processes in node I (those named NAME), a pid a line: the nodes share
                    the machine's process ids, so 'kill -STOP \$($0 pids 1 DIR llmhpc)' stops
                    node1's ranks alone
  down DIR          kill whatever runs in the nodes, delete them and the files up wrote in DIR
  sweep             delete the nodes that no folder holds any more (DIR deleted before down, or
                    an up killed outright), with whatever runs in them
In DIR: agent (Open MPI's plm_rsh_agent for the nodes), hostfile ('DIR/hostfile 2 1 1' writes a
hostfile of 2+1+1 slots and prints its path; no argument: one slot a node), hosts, nodes, netns.
USAGE
}
fake_nodes_die() { echo "$0: $*" >&2; exit 1; }     # what failed
fake_nodes_refuse() { echo "$0: $*" >&2; exit 2; }  # what was asked is wrong
fake_nodes_usage_error() {
  { echo "$0: $*"; fake_nodes_usage | head -n 1; echo "($0 --help says more)"; } >&2
  exit 2
}

# up's owner: a process detached from the terminal (setsid) that lives until down, named after
# DIR (ps shows it).
fake_nodes_start_owner() {
  local dir=$1
  # shellcheck disable=SC2016  # expanded by the owner's bash
  setsid bash -c 'cd / && echo $$ >"$1/owner.pid.new" && mv "$1/owner.pid.new" "$1/owner.pid" &&
    exec -a "llmhpc-fake-nodes $1" sleep infinity' owner "$dir" </dev/null >/dev/null 2>&1 &
  disown
  for _ in $(seq 50); do [ -f "$dir/owner.pid" ] && break; sleep 0.1; done
  [ -f "$dir/owner.pid" ]
}

# down DIR from the command line: the nodes, up's owner, and the files up wrote.
fake_nodes_remove() {
  local dir=$1 owner i
  fake_nodes_down "$dir" || return 1
  owner=$(cat "$dir/owner.pid" 2>/dev/null) || owner=""
  # Only the process up started: a pid taken since by another is left alone.
  if [ -n "$owner" ] && [ "$(tr '\0' '\n' 2>/dev/null <"/proc/$owner/cmdline" | head -n 1)" = "llmhpc-fake-nodes $dir" ]; then
    kill "$owner" 2>/dev/null || true
  fi
  rm -f "$dir/owner.pid" "$dir/owner.pid.new" "$dir/agent" "$dir/hostfile" "$dir/hosts" "$dir"/hosts-* \
    "$dir/nodes" "$dir"/holder*.log
  for i in "$dir"/cgroup* "$dir/nodetmp"; do [ ! -d "$i" ] || rmdir "$i" 2>/dev/null || true; done
  rmdir "$dir" 2>/dev/null || true  # where nothing of the user's is left in it
}

fake_nodes_main() {
  set -euo pipefail
  local cmd=${1:-} n dir i pid core owner
  case $cmd in
    -h | --help | help) fake_nodes_usage; exit 0 ;;
    up) [ $# = 3 ] || fake_nodes_usage_error "up takes N and DIR, e.g. up 3 /tmp/nodes" ;;
    run) [ $# -ge 4 ] || fake_nodes_usage_error "run takes I, DIR and a command, e.g. run 0 /tmp/nodes hostname" ;;
    pids) [ $# = 3 ] || [ $# = 4 ] ||
      fake_nodes_usage_error "pids takes I, DIR and a process name or none, e.g. pids 1 /tmp/nodes llmhpc" ;;
    down) [ $# = 2 ] || fake_nodes_usage_error "down takes DIR, e.g. down /tmp/nodes" ;;
    sweep) [ $# = 1 ] || fake_nodes_usage_error "sweep takes nothing more" ;;
    "") fake_nodes_usage_error "no command" ;;
    *) fake_nodes_usage_error "unknown command '$cmd'" ;;
  esac
  [ "$(id -u)" = 0 ] || fake_nodes_die "$cmd needs root: the nodes are network, UTS and mount namespaces, which only root makes, enters and lists the processes of (run it with sudo)"
  case $cmd in
    up)
      n=$2
      fake_nodes_args "$n" "$3" || fake_nodes_refuse "$FAKE_NODES_ERROR"
      n=$((10#$n)) dir=$FAKE_NODES_ARG_DIR
      # down removes the files up wrote: none of them may be someone else's.
      [ ! -e "$dir/owner.pid" ] ||
        fake_nodes_refuse "$dir holds what is left of an up that was stopped: run '$0 down $dir' first, or give another folder"
      # Its own names only: what down leaves (the runs' results/, the user's files) may stay, so
      # that up, run, down, up works in one folder.
      local ours
      ours=$(cd "$dir" 2>/dev/null && ls -d agent hostfile hosts hosts-* nodes netns node*.pid holder*.log cgroup* nodetmp \
        2>/dev/null | head -n 3 | paste -sd, -) || true  # no folder yet: nothing of ours
      [ -z "$ours" ] ||
        fake_nodes_refuse "DIR $dir holds fake nodes' files ($ours): run '$0 down $dir' first, or give another folder"
      mkdir -p "$dir" || fake_nodes_die "could not make the folder $dir"
      # Stopped while making them (Ctrl-C), or failing: nothing is left.
      trap 'trap - INT TERM; fake_nodes_remove "$dir" || true; echo "$0: stopped; removed what up had made" >&2; exit 1' INT TERM
      fake_nodes_start_owner "$dir" ||
        { rm -f "$dir/owner.pid.new"; rmdir "$dir" 2>/dev/null || true; fake_nodes_die "could not start up's owner process (setsid bash)"; }
      owner=$(cat "$dir/owner.pid")
      local rc=0
      fake_nodes_up "$n" "$dir" "$owner" || rc=$?
      if [ $rc = 0 ]; then fake_nodes_check "$dir" || rc=1; fi
      if [ $rc != 0 ]; then
        fake_nodes_remove "$dir" || true
        fake_nodes_die "up $n $dir: $FAKE_NODES_ERROR (nothing of it is left)"
      fi
      trap - INT TERM
      local nodes="" self=$0 name addr
      while read -r name addr core; do nodes+="${nodes:+, }$name ($addr, core $core)"; done <"$dir/nodes"
      cat <<USE
$n fake node(s) up: $nodes; state in $dir
A command in node I (its network, hostname, /dev/shm and core), from $dir:
  $self run I $dir COMMAND...
mpirun across the nodes, from node0 ($dir/hostfile 2 1 ... gives slots per node; default one each):
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,vader,self \\
    OMPI_MCA_btl_tcp_if_include=$FAKE_NODES_SUBNET OMPI_MCA_oob_tcp_if_include=$FAKE_NODES_SUBNET \\
    OMPI_MCA_mpi_yield_when_idle=1   # a node's ranks share its one core: waiting ones yield it
  $self run 0 $dir mpirun --hostfile "\$($dir/hostfile)" -np $n --bind-to none \\
    --mca plm_rsh_agent $dir/agent COMMAND...
The processes in node I (named NAME), e.g. to stop node1's ranks (kill -STOP) and see the hang report:
  $self pids I $dir [NAME]
Remove them, with whatever still runs in them:
  $self down $dir
USE
      ;;
    run | pids)
      i=$2 dir=$(realpath -m -- "$3")
      shift 3
      if [ ! -f "$dir/nodes" ] || [ ! -f "$dir/netns" ]; then
        fake_nodes_refuse "no fake nodes in $dir: make them with '$0 up N $dir'"
      fi
      n=$(wc -l <"$dir/nodes")
      if ! [[ "$i" =~ ^[0-9]+$ ]] || [ $((10#$i)) -ge "$n" ]; then
        fake_nodes_refuse "I must be a node of $dir, 0 to $((n - 1)), not '$i'"
      fi
      i=$((10#$i))
      pid=$(cat "$dir/node$i.pid" 2>/dev/null) || pid=""
      # The holder's pid, still in node I's network namespace (not a pid reused since).
      if [ -z "$pid" ] || [ "$(ip netns identify "$pid" 2>/dev/null)" != "$(fake_nodes_netns "$dir" "$i")" ]; then
        fake_nodes_die "node$i of $dir is gone (its holder no longer runs): '$0 down $dir', then up again"
      fi
      if [ "$cmd" = run ]; then
        fake_nodes_run "$i" "$dir" "$@"
      else
        fake_nodes_pids "$i" "$dir" "${1:-}"
      fi
      ;;
    down)
      dir=$(realpath -m -- "$2")
      if [ ! -e "$dir/netns" ] && [ ! -e "$dir/owner.pid" ] && [ ! -e "$dir/nodes" ]; then
        echo "no fake nodes in $dir: nothing to do ('$0 sweep' deletes nodes whose folder is gone)"
        exit 0
      fi
      fake_nodes_remove "$dir" || fake_nodes_die "down $dir: $FAKE_NODES_ERROR"
      echo "removed the fake nodes of $dir"
      ;;
    sweep)
      local swept
      swept=$(fake_nodes_sweep --lost-folders)
      if [ -n "$swept" ]; then echo "removed $(echo "$swept" | paste -sd' ' -)"; else echo "no fake nodes without a folder"; fi
      ;;
  esac
}

# Run, not sourced: the command line.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then fake_nodes_main "$@"; fi
