//! The kernel-enforced layers of a run (docs/SPEC.md §12 "Kernel-enforced layers on top",
//! "Network", "What the host offers"), together: what this host offers ([`protections`]), the
//! mount's check of `sandbox.require` ([`check_mount`]), and one run's prepared layers
//! ([`Layers`]): its network namespace, its Landlock domain and its seccomp filter.
//!
//! [`Layers::prepare`] runs where the run is started (it allocates and opens paths);
//! [`Layers::isolate_network`] runs in the child while it still has its capabilities (before
//! the credential drop) and [`Layers::enter`] as the child's last steps before `execve`:
//! Landlock, then seccomp (a domain and a filter both forbid the mounts the sandbox makes
//! before them; the filter last, because it also refuses what entering a domain would need on
//! a later kernel). Both are raw system calls: async-signal-safe.

use std::path::{Path, PathBuf};

use super::landlock::{self, Domain, Support};
use super::network;
use super::seccomp::{self, Filter};
use crate::config::{SandboxConfig, SandboxFeature, SandboxNetwork};

/// The environment variable of the daemon that removes layers from every run of its mount
/// (docs/PROTOCOL-NOTES.md SB14): a comma-separated list of `view`, `landlock`, `seccomp`. For
/// tests that attack the layers one at a time; read once, at mount, from the operator's
/// environment only, logged, and shown by `.smithfs/whoami` (`sandbox without:`).
pub const WITHOUT_VAR: &str = "SMITHFS_SANDBOX_WITHOUT";

/// The layers removed from every run of this mount ([`WITHOUT_VAR`]); all `false` in normal
/// operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Removed {
    /// No view: no mount namespace, no `pivot_root`, no private `/dev` or `/tmp`; the run sees
    /// the host's tree (still the agents' uid without capabilities, in its pid namespace).
    pub view: bool,
    /// No Landlock domain.
    pub landlock: bool,
    /// No seccomp filter.
    pub seccomp: bool,
}

/// Set once by the daemon at mount ([`Removed::set_for_this_daemon`]).
static REMOVED: std::sync::OnceLock<Removed> = std::sync::OnceLock::new();

impl Removed {
    /// The layers `text` names (`view,landlock`; blanks ignored; empty: none).
    ///
    /// # Errors
    /// A name that is not a layer, quoted.
    pub fn parse(text: &str) -> Result<Removed, String> {
        let mut r = Removed::default();
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "view" => r.view = true,
                "landlock" => r.landlock = true,
                "seccomp" => r.seccomp = true,
                other => {
                    return Err(format!(
                        "{WITHOUT_VAR}: {other:?} is not a layer (view, landlock, seccomp)"
                    ))
                }
            }
        }
        Ok(r)
    }

    /// The layers of this process's [`WITHOUT_VAR`] (unset: none).
    ///
    /// # Errors
    /// The value is not UTF-8 or names something that is not a layer.
    pub fn from_env() -> Result<Removed, String> {
        match std::env::var(WITHOUT_VAR) {
            Ok(v) => Removed::parse(&v),
            Err(std::env::VarError::NotPresent) => Ok(Removed::default()),
            Err(std::env::VarError::NotUnicode(_)) => Err(format!("{WITHOUT_VAR} is not UTF-8")),
        }
    }

    /// Whether no layer is removed.
    pub fn is_none(self) -> bool {
        self == Removed::default()
    }

    /// The removed layers' names, `, `-separated (`view, seccomp`), as whoami shows them and
    /// [`Removed::parse`] reads them back.
    pub fn names(self) -> String {
        [
            (self.view, "view"),
            (self.landlock, "landlock"),
            (self.seccomp, "seccomp"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, n)| *n)
        .collect::<Vec<_>>()
        .join(", ")
    }

    /// Record the layers this daemon's runs go without (once, at mount; a later call is
    /// ignored).
    pub fn set_for_this_daemon(r: Removed) {
        let _ = REMOVED.set(r);
    }

    /// The layers this daemon's runs go without (none unless the mount set them: a process that
    /// is not the daemon, such as `smithfs run`, reads them from `.smithfs/whoami`).
    pub fn of_this_daemon() -> Removed {
        REMOVED.get().copied().unwrap_or_default()
    }
}

/// One protection of §12 and whether this host gives it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Protection {
    /// Its name, as `sandbox.require` spells it (`landlock`, `landlock-scope`, `seccomp`,
    /// `namespaces`).
    pub name: &'static str,
    /// Whether runs get it on this host.
    pub available: bool,
    /// What it is, or what is missing and which layer still stands.
    pub detail: String,
}

/// The name `sandbox.require` gives `f`.
pub fn feature_name(f: SandboxFeature) -> &'static str {
    match f {
        SandboxFeature::Landlock => "landlock",
        SandboxFeature::LandlockScope => "landlock-scope",
        SandboxFeature::Seccomp => "seccomp",
        SandboxFeature::Namespaces => "namespaces",
    }
}

/// Every protection of §12's kernel-enforced layers, as this host gives them to the runs of a
/// daemon with this process's privileges.
pub fn protections() -> Vec<Protection> {
    let ll = Support::host();
    let missing = ll.missing();
    let landlock_detail = if ll.writes() {
        format!(
            "Landlock ABI {}: runs write only beneath their writable set",
            ll.abi
        )
    } else {
        missing
            .first()
            .map_or_else(String::new, |m| (*m).to_string())
    };
    let scope_detail = if ll.scope() {
        format!(
            "Landlock ABI {}: signals and abstract unix sockets scoped to each run",
            ll.abi
        )
    } else {
        missing
            .iter()
            .find(|m| m.contains("ABI 6"))
            .map_or("no Landlock", |m| *m)
            .to_string()
    };
    let seccomp_ok = seccomp::available();
    let ns = namespaces();
    vec![
        Protection {
            name: "landlock",
            available: ll.writes(),
            detail: landlock_detail,
        },
        Protection {
            name: "landlock-scope",
            available: ll.scope(),
            detail: scope_detail,
        },
        Protection {
            name: "seccomp",
            available: seccomp_ok,
            detail: if seccomp_ok {
                format!(
                    "a filter of {} instructions: {} calls, TIOCSTI, TIOCLINUX and new user namespaces refused, clone3 and io_uring_setup ENOSYS, other ABIs refused",
                    Filter::build(seccomp::Options::default()).len(),
                    seccomp::EPERM_CALLS.len(),
                )
            } else {
                "no seccomp filters in this kernel (CONFIG_SECCOMP_FILTER)".to_string()
            },
        },
        Protection {
            name: "namespaces",
            available: ns.is_ok(),
            detail: ns.unwrap_or_else(|why| why),
        },
    ]
}

/// Whether runs of a daemon with this process's privileges get mount, pid and network
/// namespaces: root with `CAP_SYS_ADMIN` in its effective set, or a process that is not root
/// in a user namespace of their own (docs/SPEC.md §12 "Without root"; [`super::probe`] tries
/// it). `Ok` with what they get, or why not.
fn namespaces() -> Result<String, String> {
    if crate::process::sandbox::needs_user_namespace() {
        return super::probe(&SandboxConfig::default())
            .map(|_| "mount, pid and network namespaces in a user namespace per run (the daemon is not root)".to_string());
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let sys_admin = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 21) != 0);
    if sys_admin {
        Ok("mount, pid and network namespaces (CAP_SYS_ADMIN)".to_string())
    } else {
        Err("this process is root without CAP_SYS_ADMIN: no namespaces for runs".to_string())
    }
}

/// The mount's check (docs/SPEC.md §12 "What the host offers"): with the sandbox on, every
/// protection `sandbox.require` names must be available, else the mount is refused; the
/// others that are missing are returned, one line each, for the mount's log.
///
/// # Errors
/// One line naming the required protections this host lacks, and why.
pub fn check_mount(cfg: &SandboxConfig, offered: &[Protection]) -> Result<Vec<String>, String> {
    if !cfg.enabled {
        return Ok(Vec::new());
    }
    let lacking: Vec<&Protection> = offered.iter().filter(|p| !p.available).collect();
    let refused: Vec<String> = lacking
        .iter()
        .filter(|p| cfg.require.iter().any(|f| feature_name(*f) == p.name))
        .map(|p| format!("{} ({})", p.name, p.detail))
        .collect();
    if !refused.is_empty() {
        return Err(format!(
            "sandbox.require names what this host does not give: {}",
            refused.join("; ")
        ));
    }
    Ok(lacking
        .iter()
        .map(|p| format!("sandbox: runs go without {}: {}", p.name, p.detail))
        .collect())
}

/// What a run's layers depend on in the mount-wide config, carried in the view's plan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Options {
    /// `sandbox.network: "none"`: a network namespace with loopback only.
    pub network_none: bool,
    /// `sandbox.user_namespaces`: the filter lets `clone`/`unshare` make user namespaces.
    pub user_namespaces: bool,
}

impl Options {
    /// The options of the mount-wide sandbox config `cfg`.
    pub fn of(cfg: &SandboxConfig) -> Options {
        Options {
            network_none: cfg.network == SandboxNetwork::None,
            user_namespaces: cfg.user_namespaces,
        }
    }
}

/// The step of the layers that failed, for `spawn_error`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failed {
    /// Creating the network namespace.
    Network(network::Failed),
    /// Entering the Landlock domain.
    Landlock,
    /// Installing the seccomp filter.
    Seccomp,
}

impl Failed {
    /// What failed ("building the sandbox: its Landlock domain").
    pub fn what(self) -> &'static str {
        match self {
            Failed::Network(n) => n.what(),
            Failed::Landlock => "building the sandbox: its Landlock domain",
            Failed::Seccomp => "building the sandbox: its seccomp filter",
        }
    }
}

/// One run's prepared layers.
#[derive(Debug, Default)]
pub struct Layers {
    /// `sandbox.network: "none"`: a network namespace with loopback only.
    pub network_none: bool,
    /// The Landlock domain (`None`: this kernel's Landlock is below ABI 2).
    pub domain: Option<Domain>,
    /// The seccomp filter (`None`: no seccomp filters in this kernel).
    pub filter: Option<Filter>,
}

impl Layers {
    /// The layers of a run with `options` (less those `removed`), of a mount at `mount`, whose `sandbox.writable`
    /// paths are `writable` and whose private scratch directories are `/tmp`, `/var/tmp` and
    /// `/dev/shm` as the run sees them. Paths are opened in the caller's mount namespace: call
    /// it where the run's view is (the sandbox's init, after its `pivot_root`).
    ///
    /// # Errors
    /// The Landlock ruleset could not be made on a kernel that has Landlock (ABI ≥ 2).
    pub fn prepare(
        options: Options,
        removed: Removed,
        mount: &Path,
        writable: &[PathBuf],
    ) -> Result<Layers, landlock::Error> {
        let domain = if Support::host().writes() && !removed.landlock {
            Some(Domain::prepare(&landlock::writable_set(mount, writable))?)
        } else {
            None
        };
        let filter = (seccomp::available() && !removed.seccomp).then(|| {
            Filter::build(seccomp::Options {
                user_namespaces: options.user_namespaces,
            })
        });
        Ok(Layers {
            network_none: options.network_none,
            domain,
            filter,
        })
    }

    /// The network namespace of `sandbox.network: "none"` (nothing for `host`). For the child
    /// while it holds `CAP_SYS_ADMIN`; raw system calls only.
    ///
    /// # Errors
    /// The step that failed and its errno.
    pub fn isolate_network(&self) -> Result<(), (Failed, i32)> {
        if self.network_none {
            network::isolate().map_err(|(f, e)| (Failed::Network(f), e))?;
        }
        Ok(())
    }

    /// The Landlock domain, then the seccomp filter: the child's last steps before `execve`.
    /// Raw system calls only.
    ///
    /// # Errors
    /// The step that failed and its errno.
    pub fn enter(&self) -> Result<(), (Failed, i32)> {
        if let Some(d) = &self.domain {
            d.restrict_self().map_err(|e| (Failed::Landlock, e))?;
        }
        if let Some(f) = &self.filter {
            f.install().map_err(|e| (Failed::Seccomp, e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offered(available: [bool; 4]) -> Vec<Protection> {
        ["landlock", "landlock-scope", "seccomp", "namespaces"]
            .iter()
            .zip(available)
            .map(|(name, available)| Protection {
                name,
                available,
                detail: format!("{name} detail"),
            })
            .collect()
    }

    #[test]
    fn require_refuses_only_what_is_named_and_missing() {
        let mut cfg = SandboxConfig::default();
        let all = offered([true; 4]);
        assert_eq!(check_mount(&cfg, &all), Ok(vec![]));
        let no_scope = offered([true, false, true, true]);
        let logged = check_mount(&cfg, &no_scope).expect("not required: goes on");
        assert_eq!(logged.len(), 1);
        assert!(logged[0].contains("landlock-scope"), "{logged:?}");
        cfg.require = vec![SandboxFeature::Seccomp];
        assert!(check_mount(&cfg, &no_scope).is_ok());
        cfg.require.push(SandboxFeature::LandlockScope);
        let err = check_mount(&cfg, &no_scope).expect_err("required and missing");
        assert!(
            err.contains("landlock-scope") && !err.contains("seccomp ("),
            "{err}"
        );
        // The sandbox off: nothing is required.
        cfg.enabled = false;
        assert_eq!(check_mount(&cfg, &no_scope), Ok(vec![]));
    }

    #[test]
    fn removed_layers_parse_show_and_are_left_out() {
        assert_eq!(Removed::parse(""), Ok(Removed::default()));
        assert!(Removed::parse(" , ").expect("blank").is_none());
        let r = Removed::parse("seccomp, view").expect("two layers");
        assert_eq!(
            r,
            Removed {
                view: true,
                landlock: false,
                seccomp: true
            }
        );
        assert_eq!(r.names(), "view, seccomp");
        assert_eq!(Removed::parse(&r.names()), Ok(r));
        let err = Removed::parse("view,uid").expect_err("not a layer");
        assert!(
            err.contains("\"uid\"") && err.contains(WITHOUT_VAR),
            "{err}"
        );
        // A run's layers leave out exactly what is removed.
        let dir = tempfile::tempdir().expect("tempdir");
        let all = Layers::prepare(Options::default(), Removed::default(), dir.path(), &[])
            .expect("prepare");
        let without = Removed::parse("landlock,seccomp").expect("parse");
        let some = Layers::prepare(Options::default(), without, dir.path(), &[]).expect("prepare");
        assert!(some.domain.is_none() && some.filter.is_none());
        assert_eq!(all.domain.is_some(), Support::host().writes());
        assert_eq!(all.filter.is_some(), seccomp::available());
        let no_landlock = Removed::parse("landlock").expect("parse");
        let one =
            Layers::prepare(Options::default(), no_landlock, dir.path(), &[]).expect("prepare");
        assert!(one.domain.is_none());
        assert_eq!(one.filter.is_some(), seccomp::available());
    }

    #[test]
    fn every_feature_has_a_protection() {
        let names: Vec<&str> = protections().iter().map(|p| p.name).collect();
        for f in [
            SandboxFeature::Landlock,
            SandboxFeature::LandlockScope,
            SandboxFeature::Seccomp,
            SandboxFeature::Namespaces,
        ] {
            assert!(names.contains(&feature_name(f)), "{f:?}");
        }
    }
}
