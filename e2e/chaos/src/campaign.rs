//! One run: a 3-voter cluster of real processes (each voter in its own network namespace where
//! the machine allows it) and a gateway process in front of them, the seed's workload, its
//! faults one after the other, then everything healed, the final bytes read, and the checker.
//! Besides the history checker, a run fails when the voters' copies differ after healing, a
//! process logged a panic, or a voter's memory grew past `MEMORY_BOUND`.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};
use ursula_testkit::cluster::TestCluster;
use ursula_testkit::netns::Network;

use crate::checker::check;
use crate::history::History;
use crate::schedule::{Fault, Schedule, Target};
use crate::workload::{self, Entries, bucket, stream_path};

/// A voter's resident memory after a run stays under this.
const MEMORY_BOUND_KIB: u64 = 1024 * 1024;

pub struct Report {
    pub seed: u64,
    pub faults: Vec<&'static str>,
    pub operations: usize,
    pub anomalies: Vec<String>,
    pub seconds: f64,
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
    fn start(cluster: &TestCluster) -> Self {
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
            log: cluster.dir.path().join("gateway.log"),
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
    let cluster = if partitions {
        let network = Network::create(schedule.voters).expect("network namespaces");
        TestCluster::start_partitionable(network, schedule.voters, "")
    } else {
        TestCluster::start(schedule.voters, "")
    };
    let cluster = Arc::new(cluster);
    let mut gateway = Gateway::start(&cluster);
    let entries = Arc::new(Entries {
        cluster: cluster.clone(),
        gateway: gateway.addr,
        started,
    });
    let mut anomalies = Vec::new();
    let history = runtime.block_on(async {
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
        let unexpected = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let workload = &schedule.workload;
        let producers: Vec<_> = workload
            .producers
            .iter()
            .enumerate()
            .map(|(id, &(stream, entry))| {
                tokio::spawn(workload::produce(
                    entries.clone(),
                    id,
                    stream,
                    entry,
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

        for step in &schedule.steps {
            tokio::time::sleep(Duration::from_millis(step.pause_ms)).await;
            inject(&cluster, &mut gateway, step.fault, step.lasts_ms, schedule).await;
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
        let clients_done = started.elapsed();
        cluster.wait_ready().await;
        let ready = started.elapsed();
        eprintln!(
            "  faults done at {:.1} s, clients at {:.1} s, voters ready at {:.1} s",
            faults_done.as_secs_f64(),
            clients_done.as_secs_f64(),
            ready.as_secs_f64()
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
        anomalies.extend(
            unexpected
                .lock()
                .drain(..)
                .map(|u| format!("unexpected answer: {u}")),
        );
        history
    });
    anomalies.extend(check(&history).iter().map(|a| a.to_string()));
    for (i, voter) in cluster.voters.iter().enumerate() {
        if let Some(rss) = voter.rss_kib()
            && rss > MEMORY_BOUND_KIB
        {
            anomalies.push(format!("voter {} uses {rss} KiB", voter.id));
        }
        if let Some(line) = cluster.log_of(i).lines().find(|l| l.contains("panicked")) {
            anomalies.push(format!("voter {} panicked: {line}", voter.id));
        }
    }
    let gateway_log = std::fs::read_to_string(&gateway.log).unwrap_or_default();
    if let Some(line) = gateway_log.lines().find(|l| l.contains("panicked")) {
        anomalies.push(format!("the gateway panicked: {line}"));
    }
    if !anomalies.is_empty() {
        keep_logs(&cluster, &gateway, schedule.seed);
    }
    Report {
        seed: schedule.seed,
        faults: schedule.steps.iter().map(|s| s.fault.kind()).collect(),
        operations: history.operations(),
        anomalies,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// Copies the processes' logs of a failing run to `target/chaos/seed-{seed}/`.
fn keep_logs(cluster: &TestCluster, gateway: &Gateway, seed: u64) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/chaos")
        .join(format!("seed-{seed}"));
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    for voter in &cluster.voters {
        let _ = std::fs::copy(&voter.log, dir.join(format!("node-{}.log", voter.id)));
    }
    let _ = std::fs::copy(&gateway.log, dir.join("gateway.log"));
    println!("  logs kept in {}", dir.display());
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

/// Injects `fault`, holds it `lasts_ms`, and heals it.
async fn inject(
    cluster: &Arc<TestCluster>,
    gateway: &mut Gateway,
    fault: Fault,
    lasts_ms: u64,
    schedule: &Schedule,
) {
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
            let voters = schedule.voters;
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
        Fault::KillGateway => {
            gateway.kill();
            tokio::time::sleep(hold).await;
            tokio::task::block_in_place(|| gateway.spawn());
        }
    }
}
