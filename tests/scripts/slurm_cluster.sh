# A Slurm cluster for a test, started without systemd and with nothing outside its own folder
# (sourced by test_slurm_jobs.sh and test_fake_nodes.sh; it runs nothing itself):
#   slurm_install            slurm-wlm and munge, with apt-get where missing; returns 1 with the
#                            reason in SLURM_MISSING where they cannot be had
#   slurm_conf DIR NAME HOST the settings every such cluster shares, for DIR/slurm.conf: cluster
#                            NAME, slurmctld on HOST ("node0(10.77.0.11)"); state, spool (per
#                            node: %n), pid and log files and TmpFS (DIR/nodetmp) in DIR. The
#                            caller adds its ports, nodes and partition.
#   munge_up DIR [PREFIX...] a key and munged on DIR/munge.socket (run through PREFIX, e.g. a
#                            fake node's `in_node 0`); its pid appended to the caller's `pids`
# The daemons' pids go to the caller's `pids`, which stops them in reverse order.

slurm_install() {
  SLURM_MISSING=""
  if command -v sbatch >/dev/null && command -v slurmctld >/dev/null && command -v slurmd >/dev/null &&
     command -v munged >/dev/null; then
    return 0
  fi
  if ! command -v apt-get >/dev/null; then
    SLURM_MISSING="slurm-wlm and munge are not installed and there is no apt-get to install them"
    return 1
  fi
  echo "installing slurm-wlm and munge (apt-get)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge; } \
    >/tmp/llmhpc-slurm-apt.log 2>&1 && return 0
  SLURM_MISSING="apt-get install slurm-wlm munge failed (see /tmp/llmhpc-slurm-apt.log)"
  return 1
}

slurm_conf() {
  local dir=$1 name=$2 host=$3
  mkdir -p "$dir/state" "$dir/nodetmp"
  touch "$dir/plugstack.conf"
  # MinJobAge=0 keeps finished jobs' records, so sbatch --wait polls every 2 s; with the default
  # (300) it waits 2, 8, then 32 s between polls: a job of 14 s took 42. config_overrides: a node
  # is what slurm.conf says (the fake nodes share one machine's CPUs and memory).
  cat <<CONF
ClusterName=$name
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.socket
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
MinJobAge=0
SlurmdParameters=config_overrides
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool-%n
TmpFS=$dir/nodetmp
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
PlugStackConfig=$dir/plugstack.conf
CONF
}

munge_up() {
  local dir=$1
  shift
  mungekey -c -k "$dir/munge.key" >/dev/null 2>&1 || dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 2>/dev/null
  chmod 600 "$dir/munge.key"
  "$@" munged -F --socket="$dir/munge.socket" --key-file="$dir/munge.key" --pid-file="$dir/munged.pid" \
    --log-file="$dir/munged.log" --seed-file="$dir/munged.seed" >>"$dir/munged.log" 2>&1 3>&- &
  pids+=($!)
  for _ in $(seq 50); do [ -S "$dir/munge.socket" ] && return 0; sleep 0.1; done
  return 1
}
