//! Signals to one container's processes, as a crash, an OOM kill or a
//! freeze would deliver them, through the node's process table: the suite
//! runs as root on the machine whose kernel runs the pods (the tool's node,
//! or a kind node, whose containers are processes of the docker host).

use std::path::Path;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

use crate::e2e::cluster::Scenario;

/// Sends SIG`signal` (KILL, STOP, CONT, TERM) to the main process of
/// `container` (an app or init container) in `pod`, once it runs: a
/// follower's containers may still be starting when its leader already
/// leads.
pub async fn signal_container(s: &Scenario, pod: &str, container: &str, signal: &str) {
    let pid = running_pid(s, pod, container, &format!("to send it SIG{signal}")).await;
    signal_process(pid, signal, &format!("{pod}/{container}"));
}

/// Sends `signal` to process `pid` (`what` it is, for the message): with
/// the pid found beforehand, this needs no API server.
pub fn signal_process(pid: u32, signal: &str, what: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("running kill");
    assert!(status.success(), "kill -{signal} {pid} ({what})");
}

/// The main process of `container` in `pod`, once it runs (`why`: for
/// what, in the message if it never does).
pub async fn running_pid(s: &Scenario, pod: &str, container: &str, why: &str) -> u32 {
    let what = format!("pod {pod}'s container {container} running, {why}");
    let id = crate::e2e::cluster::wait_for(&what, std::time::Duration::from_secs(60), || async {
        let status = container_status(s, pod, container).await?;
        status.state?.running?;
        status.container_id
    })
    .await;
    let id = id.rsplit("://").next().unwrap_or(&id).to_string();
    container_main_pid(&id).unwrap_or_else(|| {
        panic!("no process of container {id} in /proc: the fault scenarios run on the node's machine, as root")
    })
}

/// The process of the container whose parent is outside it (its PID 1).
pub fn container_main_pid(container_id: &str) -> Option<u32> {
    let parent = |pid: u32| -> Option<u32> { stat_fields(pid).get(1)?.parse().ok() };
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| in_container(*pid, container_id))
        .find(|pid| parent(*pid).is_some_and(|ppid| !in_container(ppid, container_id)))
}

/// Process `pid` runs in the container `container_id` (its cgroup names it).
pub fn in_container(pid: u32, container_id: &str) -> bool {
    std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("cgroup"))
        .is_ok_and(|cgroup| cgroup.contains(container_id))
}

/// The fields of /proc/PID/stat after `pid (comm)`: state, ppid, pgrp,
/// session, tty_nr, tpgid, flags, … (proc(5)); none if the process is gone.
/// comm may hold spaces, so the split is after its `)`.
pub fn stat_fields(pid: u32) -> Vec<String> {
    let stat = std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or_default();
    rest.split_whitespace().map(str::to_string).collect()
}

/// The status of `container` (an app or init container) of `pod`.
async fn container_status(s: &Scenario, pod: &str, container: &str) -> Option<ContainerStatus> {
    let status = s.api::<Pod>().get(pod).await.ok()?.status?;
    let mut statuses = status
        .container_statuses
        .into_iter()
        .flatten()
        .chain(status.init_container_statuses.into_iter().flatten());
    statuses.find(|c| c.name == container)
}

/// How many times the kubelet restarted `container` of `pod`.
pub async fn restarts(s: &Scenario, pod: &str, container: &str) -> Option<i32> {
    container_status(s, pod, container).await.map(|c| c.restart_count)
}

/// Kills `container` of `pod` and waits until the kubelet has restarted it:
/// the fault really happened before the scenario judges what followed.
pub async fn kill_and_await_restart(s: &Scenario, pod: &str, container: &str) {
    let before = restarts(s, pod, container)
        .await
        .unwrap_or_else(|| panic!("{pod} has no container {container}"));
    signal_container(s, pod, container, "KILL").await;
    crate::e2e::cluster::wait_for(
        &format!("the kubelet restarting {pod}/{container}"),
        std::time::Duration::from_secs(60),
        || async { restarts(s, pod, container).await.filter(|n| *n > before).map(|_| ()) },
    )
    .await;
}

/// A pod's outgoing TCP traffic to one address dropped inside the pod's
/// network namespace (iptables there), as a network partition between the
/// pod and that server would: established connections hang, new ones time
/// out. Healed by [`heal`](Self::heal) or when dropped.
pub struct Partition {
    netns: String,
    rule: Vec<String>,
    healed: bool,
}

impl Partition {
    pub async fn start(s: &Scenario, pod: &str, to: std::net::SocketAddr) -> Partition {
        let pod_object: Pod = s.api().get(pod).await.unwrap_or_else(|e| panic!("pod {pod}: {e}"));
        let status = pod_object.status.unwrap_or_default();
        let id = status
            .container_statuses
            .into_iter()
            .flatten()
            .find_map(|c| c.container_id)
            .unwrap_or_else(|| panic!("pod {pod} has no running container"));
        let id = id.rsplit("://").next().unwrap_or(&id).to_string();
        let pid = container_main_pid(&id).unwrap_or_else(|| {
            panic!("no process of container {id} in /proc: the suite runs on the node's machine, as root")
        });
        let rule = [
            "OUTPUT",
            "-p",
            "tcp",
            "-d",
            &to.ip().to_string(),
            "--dport",
            &to.port().to_string(),
            "-j",
            "DROP",
        ]
        .map(String::from)
        .to_vec();
        let partition = Partition {
            netns: format!("--net=/proc/{pid}/ns/net"),
            rule,
            healed: false,
        };
        partition
            .iptables("-A")
            .unwrap_or_else(|e| panic!("cutting {pod} off from {to}: {e}"));
        partition
    }

    fn iptables(&self, action: &str) -> Result<(), String> {
        let out = std::process::Command::new("nsenter")
            .arg(&self.netns)
            .arg("iptables")
            .arg(action)
            .args(&self.rule)
            .output()
            .map_err(|e| format!("running nsenter iptables (util-linux, iptables): {e}"))?;
        out.status
            .success()
            .then_some(())
            .ok_or_else(|| String::from_utf8_lossy(&out.stderr).into_owned())
    }

    pub fn heal(mut self) {
        self.healed = true;
        self.iptables("-D")
            .unwrap_or_else(|e| panic!("healing the partition: {e}"));
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        if !self.healed {
            // The pod may be gone already, and its namespace with it.
            let _ = self.iptables("-D");
        }
    }
}
