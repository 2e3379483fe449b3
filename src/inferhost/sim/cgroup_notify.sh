#!/bin/sh
# The lab's stand-in for the kernel's notice that a cgroup is empty, run in each lab machine.
#
# A Proxmox VE 9 host has cgroup v2 only: the systemd of its containers watches each unit's cgroup.events and sees
# at once when a unit's last process is gone. The lab's machines may run on a host with the hybrid cgroup layout,
# where their systemd runs in legacy mode and waits for the release agent, which the kernel never calls inside a
# container: a unit whose main process exits before the others (vLLM's rank whose worker died) then stays
# "deactivating" until TimeoutStopSec although its cgroup is long empty. Every 2 s this tells systemd of each
# stopping service whose cgroup holds no process, as the release agent would. The unit that runs it starts only
# where systemd listens for the agent (legacy mode).
hierarchy=/sys/fs/cgroup/systemd
while sleep 2; do
  systemctl list-units --type=service --state=deactivating --plain --no-legend | while read -r unit _; do
    cgroup=$(systemctl show -P ControlGroup "$unit")
    [ -n "$cgroup" ] && [ -d "$hierarchy$cgroup" ] || continue
    if [ -z "$(find "$hierarchy$cgroup" -name cgroup.procs -exec cat {} +)" ]; then
      /usr/lib/systemd/systemd-cgroups-agent "$cgroup"
    fi
  done
done
