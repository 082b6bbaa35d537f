//! Command line (docs/SPEC.md §6): one file per subcommand. Errors end as one clear line on
//! stderr and a non-zero exit.

mod accept;
mod attach;
mod attach_command;
mod cancel;
mod completions;
mod diff;
mod doctor;
mod events;
mod help;
pub mod ids;
pub mod init;
mod logs;
pub mod mount;
mod mount_helper;
mod mount_opts;
mod pty;
mod reload;
mod render;
mod retry;
pub mod run;
mod settle;
mod status;
pub mod store;
mod ui;
mod umount;
pub(crate) mod util;
mod wait;
pub mod whoami;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// smithfs: a FUSE filesystem that enforces the Agent Smith protocol for fleets of agents.
#[derive(Debug, Parser)]
#[command(name = "smithfs", version = help::VERSION, about, after_help = help::MAIN)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create the layout, a default config.json and the root smith in DIR.
    #[command(after_help = help::INIT)]
    Init(init::InitArgs),
    /// Mount DIR over itself (the directory is both mount point and backing store).
    #[command(after_help = help::MOUNT)]
    Mount(mount::MountArgs),
    /// Unmount DIR (stopping live runs first).
    #[command(after_help = help::UMOUNT)]
    Umount(umount::UmountArgs),
    /// Run CMD bound to a smith (operator only); exits with CMD's status.
    #[command(after_help = help::RUN)]
    Run(run::RunArgs),
    /// The calling process's identity and rights.
    #[command(after_help = help::WHOAMI)]
    Whoami(whoami::WhoamiArgs),
    /// Show the tree: state, runs, durations, result present.
    #[command(after_help = help::STATUS)]
    Status(status::StatusArgs),
    /// Show the journal (--follow: new events within a second).
    #[command(after_help = help::EVENTS)]
    Events(events::EventsArgs),
    /// Show a run's messages.log (the latest run by default), or the daemon's log.
    #[command(
        override_usage = "smithfs logs [DIR] ID [--run RUN_ID] [--follow]\n       \
                                smithfs logs [DIR] --daemon [--follow]",
        after_help = help::LOGS
    )]
    Logs(logs::LogsArgs),
    /// Wait until the tree, a smith or the final result is done (exit 0), failed (1), or the timeout (124).
    #[command(after_help = help::WAIT)]
    Wait(wait::WaitArgs),
    /// Stop a smith's run and its subtree's; returns once they are cancelled and their runs ended.
    #[command(override_usage = "smithfs cancel [DIR] ID", after_help = help::CANCEL)]
    Cancel(cancel::CancelArgs),
    /// Run a failed or cancelled smith again on its newest task (SMITH_WAKE=retry); returns once it is queued or running.
    #[command(override_usage = "smithfs retry [DIR] ID", after_help = help::RETRY)]
    Retry(retry::RetryArgs),
    /// Re-read DIR/config.json and apply it without a remount (also SIGHUP to the daemon).
    #[command(after_help = help::RELOAD)]
    Reload(reload::ReloadArgs),
    /// Check /dev/fuse, fusermount3, kernel features, cgroups and privileges.
    #[command(after_help = help::DOCTOR)]
    Doctor(doctor::DoctorArgs),
    /// With a project: a smith's changes since its base commit (docs/SPEC.md §11).
    #[command(override_usage = "smithfs diff [DIR] ID [--stat]", after_help = help::DIFF)]
    Diff(diff::DiffArgs),
    /// With a project: fetch a smith's branch into the repository; prints `BRANCH COMMIT`.
    #[command(
        override_usage = "smithfs accept [DIR] ID [--branch NAME]",
        after_help = help::ACCEPT
    )]
    Accept(accept::AcceptArgs),
    /// The fleet in a browser: tree, logs, diffs, retry/cancel/accept (prints its URL).
    #[command(after_help = help::UI)]
    Ui(ui::UiArgs),
    /// On a node: reach a remote run's tree (ticket on fd 3) and run COMMAND in it (docs/SPEC.md §13).
    #[command(override_usage = "smithfs attach [--ticket-fd N] [--cwd DIR] -- COMMAND [ARG...]")]
    Attach(attach::AttachArgs),
    /// Print a completion script for bash, zsh or fish on stdout.
    #[command(
        after_help = "Examples:\n  smithfs completions bash > ~/.local/share/bash-completion/completions/smithfs\n  smithfs completions zsh > ~/.zfunc/_smithfs\n  smithfs completions fish > ~/.config/fish/completions/smithfs.fish"
    )]
    Completions(completions::CompletionsArgs),
    /// Print the man page (or write one per command with --dir).
    #[command(hide = true)]
    Man(completions::ManArgs),
}

/// Parse the command line, run the subcommand and map its outcome to an exit code.
pub fn run() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // The sandbox's init (docs/SPEC.md §12): started by the spawn, never by a user.
    if argv
        .get(1)
        .is_some_and(|a| a == crate::process::sandbox::INIT_ARG)
    {
        crate::sandbox::init::main(&argv[2..]);
    }
    // This process is the smithfs binary: its runs' init is itself.
    crate::process::sandbox::set_init_program(std::path::Path::new("/proc/self/exe"));
    let cli = match argv.split_first() {
        Some((argv0, rest)) if mount_helper::invoked_as_helper(argv0) => match helper_argv(rest) {
            Ok(Some(a)) => Cli::parse_from(a),
            Ok(None) => return ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(2);
            }
        },
        _ => Cli::parse(),
    };
    if !matches!(cli.command, Command::Mount(_)) {
        // A reporting command piped into `head` ends quietly, as Unix tools do, instead of
        // failing on EPIPE. The daemon keeps SIGPIPE ignored: a hook or run closing its pipe
        // must not kill it.
        // SAFETY: setting a signal disposition to the default; no handler runs.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let result = match cli.command {
        Command::Init(a) => init::run(a),
        Command::Mount(a) => mount::run(a),
        Command::Umount(a) => umount::run(a),
        Command::Run(a) => run::run(a),
        Command::Whoami(a) => whoami::run(a),
        Command::Status(a) => status::run(a),
        Command::Events(a) => events::run(a),
        Command::Logs(a) => logs::run(a),
        Command::Retry(a) => retry::run(a),
        Command::Reload(a) => reload::run(a),
        Command::Wait(a) => wait::run(a),
        Command::Cancel(a) => cancel::run(a),
        Command::Doctor(a) => doctor::run(a),
        Command::Diff(a) => diff::run(a),
        Command::Accept(a) => accept::run(a),
        Command::Ui(a) => ui::run(a),
        Command::Attach(a) => attach::run(a),
        Command::Completions(a) => completions::run(a),
        Command::Man(a) => completions::man(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("smithfs: {e:#}");
            // docs/SPEC.md §6: 2 for usage errors and unknown smiths, 1 otherwise.
            if e.downcast_ref::<ids::UsageError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}

/// `mount.fuse.smithfs ARGS` (mount(8) for fstab type `fuse.smithfs`) as the `smithfs mount`
/// command line it stands for; `None` for mount(8)'s fake mount (`-f`).
fn helper_argv(
    args: &[std::ffi::OsString],
) -> Result<Option<Vec<std::ffi::OsString>>, ids::UsageError> {
    let real = |p: &std::path::Path| {
        std::fs::canonicalize(p)
            .or_else(|_| util::absolute(p).map_err(drop))
            .ok()
    };
    mount_helper::parse(args)?.to_mount_argv(|a, b| {
        let (a, b) = (real(a), real(b));
        a.is_some() && a == b
    })
}
