//! Identity resolution cost per FUSE request (docs/SPEC.md §2), in both modes: a cache hit (one
//! `PIDFD_GET_INFO` ioctl + lookups) and a miss (pidfd_open + ioctl + fstat per process climbed).
//!
//! Subjects: this bench's own thread (an operator: the walk climbs to init), and a freshly spawned
//! child bound to a smith (ancestry: the walk stops at once; cgroup: no walk, the cgroup id says it).
//! The "daemon" is a stand-in `sleep` process. Needs root for cgroup mode (skipped otherwise).
//!
//! `cargo bench --bench identity`; target: a hit under 2 µs.

use std::os::fd::AsFd;
use std::process::{Child, Command};
use std::time::Duration;

use criterion::{BatchSize, Criterion};
use smithfs::config::IdentityMode;
use smithfs::identity::{Identity, Resolver};
use smithfs::process::pidfd;
use smithfs::tree::model::SmithIdx;

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sleeper() -> Killed {
    Killed(
        Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("spawn sleep"),
    )
}

fn tid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

fn bench_mode(c: &mut Criterion, mode: IdentityMode, name: &str) {
    let daemon = sleeper();
    let r = match Resolver::new(mode, daemon.0.id()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("skipping {name}: {e}");
            return;
        }
    };
    let smith = SmithIdx(0);
    r.register_smith(smith, "smith-root").expect("register");
    let child = sleeper();
    let child_pid = child.0.id();
    r.bind(child_pid, smith).expect("bind child");
    let me = tid();
    assert_eq!(r.resolve(me), Identity::Operator);
    assert_eq!(r.resolve(child_pid), Identity::Smith(smith));

    let mut g = c.benchmark_group(name);
    g.bench_function("hit/own-tid(operator)", |b| b.iter(|| r.resolve(me)));
    g.bench_function("hit/child(smith)", |b| b.iter(|| r.resolve(child_pid)));
    g.bench_function("miss/own-tid(operator)", |b| {
        b.iter_batched(
            || r.clear_cache(),
            |()| r.resolve(me),
            BatchSize::PerIteration,
        )
    });
    g.bench_function("miss/child(smith)", |b| {
        b.iter_batched(
            || r.clear_cache(),
            |()| r.resolve(child_pid),
            BatchSize::PerIteration,
        )
    });
    g.finish();
    drop(child);
    let _ = r.shutdown(true);
    drop(daemon);
}

fn bench_syscalls(c: &mut Criterion) {
    let fd = pidfd::open(tid(), pidfd::PIDFD_THREAD).expect("pidfd_open");
    let mut g = c.benchmark_group("syscalls");
    g.bench_function("PIDFD_GET_INFO", |b| b.iter(|| pidfd::info(fd.as_fd())));
    g.bench_function("pidfd_open+close", |b| {
        b.iter(|| pidfd::open(tid(), pidfd::PIDFD_THREAD))
    });
    g.bench_function("read /proc/self/stat", |b| {
        b.iter(|| std::fs::read("/proc/thread-self/stat"))
    });
    g.finish();
}

fn main() {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
        .configure_from_args();
    bench_syscalls(&mut c);
    bench_mode(&mut c, IdentityMode::Ancestry, "ancestry");
    bench_mode(&mut c, IdentityMode::Cgroup, "cgroup");
    c.final_summary();
}
