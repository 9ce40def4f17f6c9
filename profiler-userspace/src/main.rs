//! tachyon-bpf: a system-wide eBPF sampling profiler for Python (and everything else) on Linux.
//!
//! The binary is thin: `cli` parses the command line, `run` drives one profiling run (a
//! `Session` of the library, a `Sink` of `sinks`), `launch` starts `-- COMMAND`, and `error`
//! turns failures into one line and an exit code.

mod cli;
mod convert;
mod error;
mod launch;
mod run;
mod sinks;

use cli::{Cli, Cmd};
use run::Command;

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    if bare() {
        // Nothing asked, on the command line or in TACHYON_BPF_* variables: the help, as
        // `--help` prints it, and the usage error's exit code.
        use clap::CommandFactory;
        let _ = Cli::command().print_help();
        std::process::exit(2);
    }
    let cli = match cli::parse() {
        Ok(c) => c,
        Err(e) if e.use_stderr() => {
            // One line, as every other error: clap's first, without its usage block.
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("bad command line");
            let first = first.strip_prefix("error: ").unwrap_or(first);
            eprintln!("tachyon-bpf: error: {first}{}", refused_hint(&e));
            std::process::exit(2);
        }
        Err(e) => {
            let _ = e.print();
            std::process::exit(0);
        }
    };
    // Run by sudo: what is written belongs to the user who ran it.
    if let Some((uid, gid)) = launch::sudo_user() {
        tachyon_bpf::files::set_owner(uid, gid);
    }
    if let Some(what) = &cli.generate {
        std::process::exit(generate(what));
    }
    let verbose = match &cli.cmd {
        None => cli.run.general.verbose,
        Some(Cmd::Record(a)) => a.general.verbose,
        Some(Cmd::Top(a)) => a.general.verbose,
        Some(_) => false,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let result = rt.block_on(async {
        match cli.cmd {
            None => run::run(cli.run, Command::Profile).await,
            Some(Cmd::Record(args)) => run::run(args.into(), Command::Record).await,
            Some(Cmd::Top(args)) => run::run(args.into(), Command::Top).await,
            Some(Cmd::Convert(args)) => convert::convert(args).await,
            // A short wall-mode run on the process (see `tachyon_bpf::output::dump`).
            Some(Cmd::Dump(args)) => {
                run::run((&args).into(), Command::Dump { json: args.json }).await
            }
        }
    });
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("tachyon-bpf: error: {e}");
            // The causes behind the one line, with -v.
            if verbose {
                for cause in e.causes() {
                    eprintln!("  caused by: {cause}");
                }
            }
            std::process::exit(e.code());
        }
    }
}

/// What follows clap's one line: why `top` or `record` has no such option (they take only
/// their groups of options), else a pointer to the help.
fn refused_hint(e: &clap::Error) -> &'static str {
    if e.kind() != clap::error::ErrorKind::UnknownArgument {
        return " (see --help)";
    }
    // Options before a subcommand are refused, so a subcommand is the first argument.
    match std::env::args().nth(1).as_deref() {
        Some("record") => {
            " (record writes a recording: give --format and --open to convert, and \
             --continuous to the main command)"
        }
        Some("top") => " (top shows a live table: it writes no file and sends nothing)",
        _ => " (see --help)",
    }
}

/// No argument, and no option given by its variable (a daemon configured by its environment
/// alone is not bare).
fn bare() -> bool {
    use clap::CommandFactory;
    if std::env::args_os().len() > 1 {
        return false;
    }
    let cmd = Cli::command();
    let configured = cmd
        .get_arguments()
        .filter_map(|a| a.get_env())
        .any(|name| std::env::var_os(name).is_some());
    !configured
}

/// The man page or a completion script, from the command line's own definition (so they never
/// drift from `--help`), on standard output; the exit code.
fn generate(what: &str) -> i32 {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    let mut out = std::io::stdout().lock();
    let written = match what {
        "man" => clap_mangen::Man::new(cmd).render(&mut out),
        shell => {
            let shell = match shell {
                "bash" => clap_complete::Shell::Bash,
                "zsh" => clap_complete::Shell::Zsh,
                _ => clap_complete::Shell::Fish,
            };
            clap_complete::generate(shell, &mut cmd, "tachyon-bpf", &mut out);
            Ok(())
        }
    };
    match written {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("tachyon-bpf: error: writing the {what} text: {e}");
            1
        }
    }
}
