//! CPU time of the server's processes over the measurement, read from `/proc`. On a shared
//! 2-core machine throughput moves with what else the host runs; CPU time per append moves
//! much less, and is what an optimization of the server changes.

/// User + system CPU seconds used so far by every process in `pids` (all their threads).
pub fn seconds(pids: &[u32]) -> Option<f64> {
    let ticks_per_second = ticks_per_second()?;
    let mut ticks = 0u64;
    for pid in pids {
        ticks += process_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)?;
    }
    Some(ticks as f64 / ticks_per_second)
}

/// The unit of `/proc` CPU times.
fn ticks_per_second() -> Option<f64> {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then_some(ticks as f64)
}

/// CPU seconds used so far by the live threads of every process in `pids`, summed by thread
/// name (the server names its threads: `tokio-rt-worker`, `ursula-writer`, ...). Threads that
/// ended are missing, so the parts may add up to less than `seconds`.
pub fn by_thread(pids: &[u32]) -> std::collections::BTreeMap<String, f64> {
    let mut out = std::collections::BTreeMap::new();
    let Some(ticks_per_second) = ticks_per_second() else {
        return out;
    };
    for pid in pids {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
                continue;
            };
            let (Some(name), Some(ticks)) = (thread_name(&stat), process_ticks(&stat)) else {
                continue;
            };
            *out.entry(name.to_owned()).or_insert(0.0) += ticks as f64 / ticks_per_second;
        }
    }
    out
}

/// The command name of a `/proc/.../stat` line: between the first `(` and the last `)`.
fn thread_name(stat: &str) -> Option<&str> {
    Some(&stat[stat.find('(')? + 1..stat.rfind(')')?])
}

/// utime + stime of a `/proc/{pid}/stat` line. The command name (field 2) is in parentheses
/// and may hold spaces, so fields are counted after its closing parenthesis.
fn process_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // After the name: state is field 3; utime and stime are fields 14 and 15.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_read_after_a_name_with_spaces() {
        let line = "42 (ursula node) S 1 42 42 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0 1 2 3";
        assert_eq!(process_ticks(line), Some(325));
    }

    #[test]
    fn threads_are_summed_by_name() {
        let line = "42 (ursula node) S 1 42 42 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0 1 2 3";
        assert_eq!(thread_name(line), Some("ursula node"));
        let handle = std::thread::Builder::new()
            .name("cpu-test-busy".into())
            .spawn(|| {
                let started = std::time::Instant::now();
                let mut x = 0u64;
                while started.elapsed() < std::time::Duration::from_millis(80) {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
                by_thread(&[std::process::id()])
            })
            .expect("spawn");
        let threads = handle.join().expect("join");
        let busy = threads.get("cpu-test-busy").copied().unwrap_or(0.0);
        assert!(busy >= 0.03, "{threads:?}");
    }

    #[test]
    fn busy_work_shows_up_as_cpu_time() {
        let me = [std::process::id()];
        let before = seconds(&me).expect("own stat readable");
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < std::time::Duration::from_millis(80) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let after = seconds(&me).expect("own stat readable");
        assert!(after - before >= 0.03, "{before} -> {after}");
    }
}
