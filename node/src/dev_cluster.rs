//! `ursula-node dev-cluster`: a local cluster in one command. It starts the voters as child
//! processes of this binary on loopback (and a gateway in front of them when the
//! `ursula-gateway` binary sits next to this one), prints the client URL, and stops them all on
//! Ctrl-C or SIGTERM. The voters run as a production cluster does: mutual TLS between them,
//! from a CA and certificates it issues into `{data-dir}/tls`, and an admin token.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode};

use ursula_wire::issue::ClusterFiles;

/// How long `dev-cluster`'s certificates are valid (each run issues new ones).
const CERTS_VALID_FOR: std::time::Duration = std::time::Duration::from_secs(365 * 86_400);

pub struct DevCluster {
    pub voters: u64,
    pub data_dir: PathBuf,
    pub base_port: u16,
}

fn port(base: u16, voter: u64, offset: u16) -> u16 {
    base + 10 * (voter as u16 - 1) + offset
}

/// What every voter shares besides its certificates: the admin token, the subscriptions'
/// signing key, and the URL clients use (the gateway's, or the first voter's).
struct Shared<'a> {
    admin_token: &'a Path,
    signing_key: &'a Path,
    public_url: &'a str,
}

fn voter_config(
    cluster: &DevCluster,
    id: u64,
    shared: &Shared<'_>,
    certs: &ClusterFiles,
) -> String {
    let admin_token = shared.admin_token;
    let base = cluster.base_port;
    let mut text = format!(
        "node_id = {id}\ndata_dir = {:?}\n\n[server]\nlisten = \"127.0.0.1:{}\"\nadmin_listen = \"127.0.0.1:{}\"\ncluster_listen = \"127.0.0.1:{}\"\nadmin_token_file = {admin_token:?}\npublic_url = {:?}\n{}\n[raft]\ngroup_count = 16\n",
        cluster.data_dir.join(format!("node-{id}")),
        port(base, id, 0),
        port(base, id, 1),
        port(base, id, 2),
        shared.public_url,
        certs.toml(id),
    );
    for peer in 1..=cluster.voters {
        text.push_str(&format!(
            "\n[[raft.peers]]\nid = {peer}\ncluster_url = \"https://127.0.0.1:{}\"\nclient_url = \"http://127.0.0.1:{}\"\n",
            port(base, peer, 2),
            port(base, peer, 0),
        ));
    }
    // A developer's webhook receiver runs on loopback beside the cluster.
    text.push_str(&format!(
        "\n[subscriptions]\nsigning_key_file = {:?}\nallow_loopback_webhooks = true\n",
        shared.signing_key
    ));
    text
}

/// A token of 256 random bits in hex, readable by its owner only; kept across runs.
fn write_admin_token(path: &Path) -> std::io::Result<()> {
    use std::hash::{BuildHasher, Hasher};
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if path.exists() {
        return Ok(());
    }
    // Each `RandomState` is keyed from the operating system's random source.
    let token: String = (0..4)
        .map(|_| {
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u64(0);
            format!("{:016x}", hasher.finish())
        })
        .collect();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    writeln!(file, "{token}")
}

fn spawn(program: &Path, args: &[String]) -> std::io::Result<Child> {
    Command::new(program).args(args).spawn()
}

pub fn run(cluster: DevCluster) -> ExitCode {
    if !(1..=9).contains(&cluster.voters) {
        eprintln!(
            "ursula-node dev-cluster: --voters must be between 1 and 9 (3 or 5 for a real quorum)"
        );
        return ExitCode::from(2);
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(error) => {
            eprintln!("ursula-node dev-cluster: cannot find this binary: {error}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(error) = std::fs::create_dir_all(&cluster.data_dir) {
        eprintln!(
            "ursula-node dev-cluster: cannot create {:?}: {error}",
            cluster.data_dir
        );
        return ExitCode::FAILURE;
    }
    // The voters' admin routes ask for a token, as a production cluster's do.
    let admin_token = cluster.data_dir.join("admin-token");
    if let Err(error) = write_admin_token(&admin_token) {
        eprintln!("ursula-node dev-cluster: cannot write {admin_token:?}: {error}");
        return ExitCode::FAILURE;
    }
    // A CA and the voters' certificates, issued afresh on every run: nothing expires.
    let certs = ClusterFiles {
        dir: cluster.data_dir.join("tls"),
    };
    let ids: Vec<u64> = (1..=cluster.voters).collect();
    if let Err(error) = certs.write("ursula dev cluster", &ids, &[], CERTS_VALID_FOR) {
        eprintln!(
            "ursula-node dev-cluster: cannot write certificates to {:?}: {error}",
            certs.dir
        );
        return ExitCode::FAILURE;
    }
    let signing_key = cluster.data_dir.join("signing-key.pem");
    if let Err(error) = ursula_node::subscriptions::signing::SigningKey::load(&signing_key, true) {
        eprintln!("ursula-node dev-cluster: {error}");
        return ExitCode::FAILURE;
    }
    let gateway = exe.with_file_name("ursula-gateway");
    let gateway_listen = format!("127.0.0.1:{}", cluster.base_port - 10);
    let public_url = if gateway.exists() {
        format!("http://{gateway_listen}")
    } else {
        format!("http://127.0.0.1:{}", port(cluster.base_port, 1, 0))
    };
    let shared = Shared {
        admin_token: &admin_token,
        signing_key: &signing_key,
        public_url: &public_url,
    };
    let mut children = Vec::new();
    for id in 1..=cluster.voters {
        let config = cluster.data_dir.join(format!("node-{id}.toml"));
        if let Err(error) = std::fs::write(&config, voter_config(&cluster, id, &shared, &certs)) {
            eprintln!("ursula-node dev-cluster: cannot write {config:?}: {error}");
            return ExitCode::FAILURE;
        }
        match spawn(&exe, &["--config".into(), config.display().to_string()]) {
            Ok(child) => children.push(child),
            Err(error) => {
                eprintln!("ursula-node dev-cluster: cannot start voter {id}: {error}");
                stop(&mut children);
                return ExitCode::FAILURE;
            }
        }
    }
    let voters: Vec<String> = (1..=cluster.voters)
        .map(|id| format!("http://127.0.0.1:{}", port(cluster.base_port, id, 0)))
        .collect();
    let mut url = voters[0].clone();
    if gateway.exists() {
        let listen = gateway_listen;
        let admin = format!("127.0.0.1:{}", cluster.base_port - 9);
        let mut args = vec![
            "--listen".to_owned(),
            listen.clone(),
            "--admin-listen".to_owned(),
            admin,
        ];
        for voter in &voters {
            args.push("--upstream".into());
            args.push(voter.clone());
        }
        match spawn(&gateway, &args) {
            Ok(child) => {
                children.push(child);
                url = format!("http://{listen}");
            }
            Err(error) => eprintln!("ursula-node dev-cluster: no gateway ({error})"),
        }
    }
    println!(
        "ursula dev cluster: {} voters ({})",
        cluster.voters,
        voters.join(", ")
    );
    println!("client URL: {url}");
    println!(
        "admin token (Authorization: Bearer ..., on the voters' admin ports): {}",
        admin_token.display()
    );
    println!(
        "cluster TLS (the voters' CA and certificates): {}",
        certs.dir.display()
    );
    let _ = wait_for_signal();
    stop(&mut children);
    ExitCode::SUCCESS
}

fn wait_for_signal() -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        tokio::select! {
            _ = term.recv() => Ok(()),
            result = tokio::signal::ctrl_c() => result,
        }
    })
}

/// SIGTERM to every child (voters drain and stop), then waits for them.
fn stop(children: &mut [Child]) {
    for child in children.iter() {
        // SAFETY: sending a signal to a child process this process started.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
        }
    }
    for child in children.iter_mut() {
        let _ = child.wait();
    }
}
