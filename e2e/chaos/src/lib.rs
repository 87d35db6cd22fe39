//! A seeded fault campaign against real Ursula processes (see `e2e/chaos/README.md`): a seed
//! fixes a schedule of faults and a workload (`schedule`), the clients record what they saw
//! (`workload`, `history`), and one checker judges the history (`checker`). `campaign` runs
//! one seed.

pub mod campaign;
pub mod checker;
pub mod clock;
pub mod disk;
pub mod history;
pub mod lifecycle;
mod logs;
pub mod relay;
pub mod rng;
pub mod schedule;
mod sse;
pub mod workload;
