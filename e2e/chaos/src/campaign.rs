//! One run: a cluster of 3 or 5 real voter processes (each in its own network namespace where
//! the machine allows it, each reached by its peers through a fault-injecting relay, a voter
//! that a full disk will hit on a small disk of its own) and one or two gateway processes in
//! front of them, the seed's workload, its faults one after the other, then everything healed,
//! the final bytes read, and the checker. Besides the history checker, a run fails when the
//! voters' copies differ after healing, a process logged a panic or an error that no fault of
//! the run explains, or a voter's memory grew past `MEMORY_BOUND`.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};
use ursula_testkit::cluster::{Layout, TestCluster};
use ursula_testkit::netns::Network;

use crate::checker::check;
use crate::clock::{self, Clocks};
use crate::history::History;
use crate::relay::{LinkFault, Relay};
use crate::schedule::{Fault, Schedule, Target};
use crate::workload::{self, Entries, bucket, stream_path};
use crate::{disk, lifecycle};

/// How long a voter may take to exit after SIGTERM: Kubernetes' default termination grace.
const SIGTERM_GRACE: Duration = Duration::from_secs(30);

/// How long each membership change that brings back a voter which lost its volume may take,
/// catch-up included.
const READMISSION: Duration = Duration::from_secs(60);

/// A voter's or a gateway's resident memory after a run stays under this.
const MEMORY_BOUND_KIB: u64 = 1024 * 1024;

pub struct Report {
    pub seed: u64,
    pub faults: Vec<&'static str>,
    pub operations: usize,
    pub anomalies: Vec<String>,
    pub seconds: f64,
    /// What happened that is not an anomaly but worth a line (a voter that exited on a full
    /// disk, say).
    pub notes: Vec<String>,
}

/// The gateway, a process of its own on a fixed port, so that a restart is where clients
/// left it.
struct Gateway {
    args: Vec<String>,
    log: std::path::PathBuf,
    child: Option<Child>,
    addr: std::net::SocketAddr,
}

impl Gateway {
    fn start(cluster: &TestCluster, index: usize) -> Self {
        let ports = ursula_testkit::ports::free_ports(2);
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], ports[0]).into();
        let mut args = vec![
            "--listen".to_owned(),
            addr.to_string(),
            "--admin-listen".to_owned(),
            format!("127.0.0.1:{}", ports[1]),
        ];
        for upstream in cluster.upstreams() {
            args.extend(["--upstream".to_owned(), upstream]);
        }
        let mut gateway = Self {
            args,
            log: cluster.dir.path().join(format!("gateway-{index}.log")),
            child: None,
            addr,
        };
        gateway.spawn();
        gateway
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("gateway log");
        let child = Command::new(ursula_testkit::binaries::gateway())
            .args(&self.args)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn ursula-gateway");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(self.addr).is_err() {
            assert!(Instant::now() < deadline, "the gateway did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `schedule`; `partitions` says whether the voters get network namespaces.
pub fn run(schedule: &Schedule, partitions: bool) -> Report {
    let started = Instant::now();
    let runtime = ursula_testkit::runtime();
    let network = partitions.then(|| Network::create(schedule.voters).expect("network namespaces"));
    let relay_ip: std::net::IpAddr = network
        .as_ref()
        .map_or(std::net::Ipv4Addr::LOCALHOST, |n| n.host_cluster_ip)
        .into();
    let relays = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let small_disks = Arc::new(disk::SmallDisks::default());
    let clocks = schedule
        .steps_clocks()
        .then(|| Arc::new(Clocks::new(clock::library().expect("libfaketime"))));
    let layout = {
        let (relays, handle) = (relays.clone(), runtime.handle().clone());
        let (disks, wanted) = (small_disks.clone(), schedule.small_disks());
        Layout {
            advertise: Some(Box::new(move |_, listens| {
                let relay = Relay::start(&handle, relay_ip, listens);
                let addr = relay.addr;
                relays.lock().push(relay);
                addr
            })),
            prepare_data: Some(Box::new(move |voter, dir| {
                if wanted.contains(&voter) {
                    disks.mount(dir);
                }
            })),
            environment: clocks.clone().map(|clocks| {
                Box::new(move |voter| clocks.environment(voter))
                    as ursula_testkit::cluster::Environment
            }),
        }
    };
    let cluster = Arc::new(TestCluster::start_laid_out(
        network,
        schedule.voters,
        layout,
    ));
    let relays: Vec<Relay> = std::mem::take(&mut *relays.lock());
    let mut gateways: Vec<Gateway> = (0..schedule.gateways)
        .map(|index| Gateway::start(&cluster, index))
        .collect();
    let entries = Arc::new(Entries {
        cluster: cluster.clone(),
        gateways: gateways.iter().map(|g| g.addr).collect(),
        started,
    });
    let mut anomalies = Vec::new();
    let mut notes = Vec::new();
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.block_on(async {
            cluster.wait_ready().await;
            for stream in 0..schedule.workload.streams {
                let created = cluster
                    .send(
                        0,
                        Method::PUT,
                        &stream_path(stream),
                        &[("content-type", "text/plain")],
                        Bytes::new(),
                        Duration::from_secs(20),
                    )
                    .await;
                assert!(
                    created.as_ref().is_some_and(|r| r.status.is_success()),
                    "cannot create the streams"
                );
            }
            let stop = Arc::new(AtomicBool::new(false));
            let supervising = Arc::new(AtomicBool::new(true));
            let supervisor = tokio::spawn(supervise(cluster.clone(), supervising.clone()));
            let unexpected = Arc::new(parking_lot::Mutex::new(Vec::new()));
            let workload = &schedule.workload;
            let producers: Vec<_> = workload
                .producers
                .iter()
                .enumerate()
                .map(|(id, &(stream, entry, in_flight))| {
                    tokio::spawn(workload::produce(
                        entries.clone(),
                        id,
                        stream,
                        entry,
                        in_flight,
                        stop.clone(),
                        unexpected.clone(),
                    ))
                })
                .collect();
            let plain: Vec<_> = workload
                .plain_writers
                .iter()
                .enumerate()
                .map(|(id, &(stream, entry))| {
                    tokio::spawn(workload::write_plain(
                        entries.clone(),
                        id,
                        stream,
                        entry,
                        stop.clone(),
                        unexpected.clone(),
                    ))
                })
                .collect();
            let readers: Vec<_> = workload
                .readers
                .iter()
                .map(|&(stream, entry)| {
                    tokio::spawn(workload::read(entries.clone(), stream, entry, stop.clone()))
                })
                .collect();
            let followers: Vec<_> = workload
                .followers
                .iter()
                .map(|&(stream, entry)| {
                    tokio::spawn(workload::follow(
                        entries.clone(),
                        stream,
                        entry,
                        stop.clone(),
                    ))
                })
                .collect();

            let pollers: Vec<_> = workload
            .pollers
            .iter()
            .map(|&(stream, entry)| {
                tokio::spawn(workload::poll(entries.clone(), stream, entry, stop.clone()))
            })
            .collect();
        let lifecycles: Vec<_> = workload
                .lifecycles
                .iter()
                .enumerate()
                .map(|(client, &entry)| {
                    tokio::spawn(lifecycle::run(entries.clone(), client, entry, stop.clone()))
                })
                .collect();

            let faults = Faults {
                cluster: &cluster,
                relays: &relays,
                clocks: clocks.as_deref(),
                schedule,
            };
            for step in &schedule.steps {
                tokio::time::sleep(Duration::from_millis(step.pause_ms)).await;
                if let Some(anomaly) = faults
                    .inject(&mut gateways, step.fault, step.lasts_ms)
                    .await
                {
                    anomalies.push(anomaly);
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            stop.store(true, Ordering::Relaxed);
            let faults_done = started.elapsed();

            let mut history = History::default();
            for task in producers {
                history.producers.push(task.await.expect("producer"));
            }
            for task in plain {
                history.plain.push(task.await.expect("plain writer"));
            }
            for task in readers {
                history.reads.extend(task.await.expect("reader"));
            }
            for task in followers {
                history.follows.push(task.await.expect("follower"));
            }
            for task in pollers {
            history.follows.push(task.await.expect("long-poll follower"));
        }
        for task in lifecycles {
                history
                    .lifecycles
                    .push(task.await.expect("lifecycle client"));
            }
            let clients_done = started.elapsed();
            supervising.store(false, Ordering::Relaxed);
            let exits = supervisor.await.expect("supervisor");
            let explained = schedule
                .steps
                .iter()
                .any(|s| matches!(s.fault, Fault::DiskFull { .. }));
            for exit in exits {
                if explained {
                    notes.push(exit);
                } else {
                    anomalies.push(exit);
                }
            }
            cluster.wait_ready().await;
            let ready = started.elapsed();
            eprintln!(
                "  faults done at {:.1} s, clients at {:.1} s, voters ready at {:.1} s; {} lifecycle rounds",
                faults_done.as_secs_f64(),
                clients_done.as_secs_f64(),
                ready.as_secs_f64(),
                history.lifecycles.iter().map(|l| l.rounds.len()).sum::<usize>()
            );
            for stream in 0..schedule.workload.streams {
                let bytes = cluster.read_all(&stream_path(stream)).await;
                if let Err(differs) = cluster.replicas_equal(&bucket(stream), "s", &bytes).await {
                    anomalies.push(format!("after healing, {differs}"));
                }
                history
                    .finals
                    .push(String::from_utf8_lossy(&bytes).into_owned());
            }
            for log in &history.lifecycles {
                let mut rounds = Vec::new();
                for round in &log.rounds {
                    rounds.push(lifecycle::remains(&cluster, log.client, round.n).await);
                }
                history.lifecycle_finals.push(rounds);
            }
            anomalies.extend(
                unexpected
                    .lock()
                    .drain(..)
                    .map(|u| format!("unexpected answer: {u}")),
            );
            history
        })
    }));
    // A run that panicked (a voter that never became ready, a read no voter answered) keeps
    // its logs too.
    let history = ran.unwrap_or_else(|panic| {
        let why = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        anomalies.push(format!("the run panicked: {why}"));
        History::default()
    });
    anomalies.extend(check(&history).iter().map(|a| a.to_string()));
    let explained = crate::logs::Explained::by(schedule);
    for (i, voter) in cluster.voters.iter().enumerate() {
        if let Some(rss) = voter.rss_kib()
            && rss > MEMORY_BOUND_KIB
        {
            anomalies.push(format!("voter {} uses {rss} KiB", voter.id));
        }
        let log = cluster.log_of(i);
        for line in explained.unexplained(&log) {
            anomalies.push(format!("voter {} logged: {line}", voter.id));
        }
    }
    for (g, gateway) in gateways.iter().enumerate() {
        if let Some(rss) = gateway
            .child
            .as_ref()
            .and_then(|child| ursula_testkit::cluster::rss_kib(child.id()))
            && rss > MEMORY_BOUND_KIB
        {
            anomalies.push(format!("gateway {g} uses {rss} KiB"));
        }
        let log = std::fs::read_to_string(&gateway.log).unwrap_or_default();
        for line in explained.unexplained(&log) {
            anomalies.push(format!("gateway {g} logged: {line}"));
        }
    }
    if !anomalies.is_empty() {
        keep_logs(&cluster, &gateways, schedule.seed);
    }
    drop(entries);
    drop(gateways);
    // The voters are gone before their small disks are unmounted.
    drop(Arc::into_inner(cluster));
    drop(small_disks);
    Report {
        seed: schedule.seed,
        faults: schedule.steps.iter().map(|s| s.fault.kind()).collect(),
        operations: history.operations(),
        anomalies,
        seconds: started.elapsed().as_secs_f64(),
        notes,
    }
}

/// Copies the processes' logs of a failing run to `target/chaos/seed-{seed}/`.
fn keep_logs(cluster: &TestCluster, gateways: &[Gateway], seed: u64) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/chaos")
        .join(format!("seed-{seed}"));
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    for voter in &cluster.voters {
        let _ = std::fs::copy(&voter.log, dir.join(format!("node-{}.log", voter.id)));
    }
    for (g, gateway) in gateways.iter().enumerate() {
        let _ = std::fs::copy(&gateway.log, dir.join(format!("gateway-{g}.log")));
    }
    println!("  logs kept in {}", dir.display());
}

/// Starts again every voter that exits by itself, as a pod's kubelet would, until
/// `supervising` ends; what exited, and when. A node exits by itself only to recover from a
/// write its disk refused (a full disk explains that; nothing else does).
async fn supervise(cluster: Arc<TestCluster>, supervising: Arc<AtomicBool>) -> Vec<String> {
    let mut exits = Vec::new();
    let started = Instant::now();
    while supervising.load(Ordering::Relaxed) {
        for v in 0..cluster.voters.len() {
            if let Some(status) = cluster.exited(v) {
                exits.push(format!(
                    "voter {} exited by itself ({status}) {:.1} s into the run; started again",
                    v + 1,
                    started.elapsed().as_secs_f64()
                ));
                let cluster = cluster.clone();
                let _ = tokio::task::spawn_blocking(move || cluster.restart(v)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    exits
}

/// The voter a target names now.
async fn resolve(cluster: &TestCluster, target: Target) -> usize {
    match target {
        Target::Voter(v) => v,
        Target::LeaderOf(stream) => cluster
            .leader_of(cluster.group_of(&bucket(stream)))
            .await
            .unwrap_or(stream % cluster.voters.len()),
    }
}

/// What a fault acts on.
struct Faults<'a> {
    cluster: &'a Arc<TestCluster>,
    relays: &'a [Relay],
    clocks: Option<&'a Clocks>,
    schedule: &'a Schedule,
}

impl Faults<'_> {
    /// Injects `fault`, holds it `lasts_ms`, and heals it; what went wrong doing it (a voter
    /// that does not stop cleanly on SIGTERM).
    async fn inject(
        &self,
        gateways: &mut [Gateway],
        fault: Fault,
        lasts_ms: u64,
    ) -> Option<String> {
        let cluster = self.cluster;
        let hold = Duration::from_millis(lasts_ms);
        let blocking = |action: Box<dyn FnOnce(&TestCluster) + Send>| {
            let cluster = cluster.clone();
            async move {
                tokio::task::spawn_blocking(move || action(&cluster))
                    .await
                    .expect("fault action");
            }
        };
        match fault {
            Fault::Kill(target) => {
                let v = resolve(cluster, target).await;
                blocking(Box::new(move |c| c.kill(v))).await;
                tokio::time::sleep(hold).await;
                blocking(Box::new(move |c| c.restart(v))).await;
            }
            Fault::Freeze(target) => {
                let v = resolve(cluster, target).await;
                cluster.freeze(v);
                tokio::time::sleep(hold).await;
                cluster.thaw(v);
            }
            Fault::Partition {
                target,
                clients_too,
            } => {
                let v = resolve(cluster, target).await;
                blocking(Box::new(move |c| c.partition(v, clients_too))).await;
                tokio::time::sleep(hold).await;
                blocking(Box::new(move |c| c.heal(v))).await;
            }
            Fault::KillAll => {
                let voters = self.schedule.voters;
                blocking(Box::new(move |c| (0..voters).for_each(|v| c.kill(v)))).await;
                tokio::time::sleep(hold).await;
                blocking(Box::new(move |c| (0..voters).for_each(|v| c.restart(v)))).await;
            }
            Fault::Drain(target) => {
                let v = resolve(cluster, target).await;
                let admin = cluster.voters[v].admin();
                let _ = admin
                    .try_send(Method::POST, "/admin/drain", &[], Bytes::new())
                    .await;
                tokio::time::sleep(hold).await;
                // Undrained until it says so (it may be busy catching up).
                for _ in 0..50 {
                    let answer = admin
                        .try_send(Method::DELETE, "/admin/drain", &[], Bytes::new())
                        .await;
                    if answer.is_ok_and(|r| r.status == StatusCode::OK) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            Fault::KillGateway(g) => {
                gateways[g].kill();
                tokio::time::sleep(hold).await;
                tokio::task::block_in_place(|| gateways[g].spawn());
            }
            Fault::FlakyLink { target, link } => {
                let v = resolve(cluster, target).await;
                self.relays[v].set(link);
                tokio::time::sleep(hold).await;
                self.relays[v].set(LinkFault::Clean);
            }
            Fault::DiskFull { voter, to_zero } => {
                let filler = cluster.data_dir(voter).join("chaos-filler");
                let leave = if to_zero { 0 } else { disk::UNDER_THE_FLOOR };
                let path = filler.clone();
                tokio::task::spawn_blocking(move || disk::fill(&path, leave))
                    .await
                    .expect("fill the disk");
                tokio::time::sleep(hold).await;
                // A voter that exits meanwhile is started again by `supervise`.
                let _ = std::fs::remove_file(&filler);
            }
            Fault::ClockStep { target, seconds } => {
                let v = resolve(cluster, target).await;
                let clocks = self.clocks.expect("fake clocks where a clock steps");
                clocks.step(v, seconds);
                tokio::time::sleep(hold).await;
                clocks.step(v, 0);
            }
            Fault::LoseVolume(target) => {
                let v = resolve(cluster, target).await;
                blocking(Box::new(move |c| {
                    c.wipe(v);
                    c.restart(v);
                }))
                .await;
                tokio::time::sleep(hold).await;
                return self.readmit(v).await.err();
            }
            Fault::RollingRestart => {
                for v in 0..self.schedule.voters {
                    let stopped = tokio::task::spawn_blocking({
                        let cluster = cluster.clone();
                        move || {
                            let by_itself = cluster.stop(v, SIGTERM_GRACE);
                            cluster.restart(v);
                            by_itself
                        }
                    })
                    .await
                    .expect("restart a voter");
                    match stopped {
                        Some(status) if status.success() => {}
                        Some(status) => {
                            return Some(format!("voter {} exited {status} on SIGTERM", v + 1));
                        }
                        None => {
                            return Some(format!(
                                "voter {} still ran {} s after SIGTERM",
                                v + 1,
                                SIGTERM_GRACE.as_secs()
                            ));
                        }
                    }
                    cluster.wait_ready().await;
                }
            }
        }
        None
    }

    /// Brings voter `v`, which lost its volume, back as the README says: demoted to a
    /// learner, caught up, promoted; every change through another voter's admin API, each
    /// asked again until it is made (a change already made succeeds at once).
    async fn readmit(&self, v: usize) -> Result<(), String> {
        let cluster = self.cluster;
        let id = cluster.voters[v].id;
        let all: Vec<u64> = cluster.voters.iter().map(|voter| voter.id).collect();
        let others: Vec<u64> = all.iter().copied().filter(|&other| other != id).collect();
        let via = (v + 1) % cluster.voters.len();
        let path = format!("/admin/membership/voters/{id}");
        let started = Instant::now();
        let mut took = Vec::new();
        for (method, voters, learners) in [
            (Method::DELETE, &others, vec![id]),
            (Method::PUT, &all, vec![]),
        ] {
            let deadline = Instant::now() + READMISSION;
            loop {
                let (status, answer) = cluster.admin_call(via, method.clone(), &path, None).await;
                if status == StatusCode::OK {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(format!(
                        "voter {id} lost its volume; {method} {path} still answered {status} after {READMISSION:?}: {answer}"
                    ));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            cluster
                .settle_membership(voters, &learners, 64, READMISSION)
                .await
                .map_err(|unsettled| format!("voter {id} lost its volume; {unsettled}"))?;
            took.push(format!(
                "{method} settled at {:.1} s",
                started.elapsed().as_secs_f64()
            ));
        }
        eprintln!("  voter {id} readmitted: {}", took.join(", "));
        Ok(())
    }
}
