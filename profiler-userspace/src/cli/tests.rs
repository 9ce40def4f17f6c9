use super::*;

fn parse(args: &[&str]) -> Result<Cli, String> {
    Cli::try_parse_from(std::iter::once("tachyon-bpf").chain(args.iter().copied()))
        .map_err(|e| e.to_string())
}

#[test]
fn every_run_option_has_its_variable_and_the_help_names_it() {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    let help = cmd.render_long_help().to_string();
    let mut n = 0;
    for a in cmd.get_arguments() {
        let id = a.get_id().as_str();
        if a.is_hide_set() || a.is_positional() || matches!(id, "help" | "version") {
            continue;
        }
        let want = format!("TACHYON_BPF_{}", id.to_ascii_uppercase());
        let env = a.get_env().map(|e| e.to_string_lossy().into_owned());
        assert_eq!(env.as_deref(), Some(want.as_str()), "--{id}");
        assert!(
            help.contains(&format!("[env: {want}")),
            "--help names {want}"
        );
        n += 1;
    }
    assert!(n >= 25, "{n} options");
}

/// `top` and `record` take only their groups of options: every option of the main command
/// that a subcommand's help does not list is refused by clap, and every one it lists is
/// taken.
#[test]
fn each_subcommand_takes_only_what_it_lists() {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    let main: Vec<(String, bool)> = cmd
        .get_arguments()
        .filter(|a| !a.is_positional() && !a.is_hide_set())
        .filter_map(|a| Some((a.get_long()?.to_string(), a.get_action().takes_values())))
        .filter(|(l, _)| l != "help" && l != "version")
        .collect();
    assert!(main.len() >= 25, "{main:?}");
    // A value each option takes, to tell "refused" from "bad value".
    let value = |long: &str| match long {
        "pid" => "1",
        "rate" | "keep" => "10",
        "duration" | "rotate" => "5s",
        "mode" => "cpu",
        "stack-size" => "8192",
        "ring-mb" => "8",
        "async-aware" => "all",
        "file-mode" => "640",
        "otlp" | "push" => "http://127.0.0.1:1",
        "label" => "a=b",
        "env-label" => "X",
        "format" => "pprof",
        _ => "x",
    };
    let mut checked = 0;
    for (sub, groups) in [
        ("top", &["Target:", "Sampling:", "Python:", "General:"][..]),
        (
            "record",
            &["Target:", "Sampling:", "Python:", "Output:", "General:"][..],
        ),
    ] {
        let help = cmd
            .find_subcommand_mut(sub)
            .unwrap()
            .render_long_help()
            .to_string();
        for h in groups {
            assert!(help.contains(h), "{sub} --help has no {h} heading:\n{help}");
        }
        for (long, takes) in &main {
            let flag = format!("--{long}");
            // An option's own line: its names, before its value and description.
            let listed = help.lines().any(|l| {
                let l = l.trim_start();
                l.starts_with('-')
                    && l.split("  ")
                        .next()
                        .unwrap_or("")
                        .split([' ', ',', '='])
                        .any(|w| w == flag || w.strip_suffix("[=<WHICH>]") == Some(&flag))
            });
            let mut args = vec![sub.to_string(), "--all".into()];
            if long == "all" {
                args.pop();
            }
            args.push(if *takes {
                format!("{flag}={}", value(long))
            } else {
                flag.clone()
            });
            let got =
                Cli::try_parse_from(std::iter::once("tachyon-bpf".to_string()).chain(args.clone()));
            match got {
                Err(e) if e.kind() == clap::error::ErrorKind::UnknownArgument => {
                    assert!(!listed, "{sub} lists {flag} but refuses it: {e}")
                }
                // Taken, or refused only for what it needs beside it (--continuous
                // without --output-dir is not a subcommand's).
                Ok(_) => assert!(listed, "{sub} takes {flag} but does not list it"),
                Err(e) => {
                    use clap::error::ErrorKind::{ArgumentConflict, MissingRequiredArgument};
                    assert!(
                        listed && matches!(e.kind(), ArgumentConflict | MissingRequiredArgument),
                        "{sub} {args:?}: {e} (listed: {listed})"
                    )
                }
            }
            checked += 1;
        }
    }
    assert!(checked >= 50, "{checked}");
    // The refusals users meet first.
    for args in [
        &["top", "--all", "-o", "x"][..],
        &["top", "--all", "--continuous"],
        &["record", "--all", "-f", "pprof"],
        &["record", "--all", "--open"],
        &["record", "--all", "--push", "http://x"],
    ] {
        let e = Cli::try_parse_from(std::iter::once(&"tachyon-bpf").chain(args)).unwrap_err();
        assert_eq!(
            e.kind(),
            clap::error::ErrorKind::UnknownArgument,
            "{args:?}"
        );
    }
    let record = cmd
        .find_subcommand_mut("record")
        .unwrap()
        .render_long_help()
        .to_string();
    assert!(record.contains("profile.tbpf") && !record.contains("profile.json"));
    // The main command lists everything, grouped.
    let main = cmd.render_long_help().to_string();
    for h in [
        "Target:",
        "Sampling:",
        "Python:",
        "Output:",
        "Continuous:",
        "General:",
    ] {
        assert!(main.contains(h), "no {h}");
    }
    assert!(main.contains("--continuous") && main.contains("--format"));
}

/// The DaemonSet under `contrib/` configures the profiler by variables alone: each must be
/// an option's, with a value the option takes.
#[test]
fn the_daemonset_sets_only_variables_the_options_take() {
    use clap::CommandFactory;
    let yaml = include_str!("../../../contrib/kubernetes/tachyon-bpf.yaml");
    let cmd = Cli::command();
    let mut args = vec!["tachyon-bpf".to_string()];
    let mut n = 0;
    for line in yaml.lines() {
        let Some(rest) = line.trim().strip_prefix("- {name: TACHYON_BPF_") else {
            continue;
        };
        let (name, value) = rest.split_once(", value: ").expect("name and value");
        let value = value.trim_end_matches('}').trim_matches('"');
        let var = format!("TACHYON_BPF_{name}");
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_env().is_some_and(|e| e == var.as_str()))
            .unwrap_or_else(|| panic!("{var} is no option's variable"));
        let long = format!("--{}", arg.get_long().unwrap());
        if !arg.get_action().takes_values() {
            assert_eq!(value, "true", "{var}");
            args.push(long);
        } else {
            args.push(format!("{long}={value}"));
        }
        n += 1;
    }
    assert!(n >= 8, "{n} variables");
    // The same settings given as options parse, as the variables would.
    Cli::try_parse_from(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
}

/// `--help` of the command and of each subcommand, as docs/cli.md's reference shows them:
/// 100 columns, variables named without their values here.
fn reference() -> String {
    use clap::CommandFactory;
    fn fixed(c: clap::Command) -> clap::Command {
        c.term_width(100)
            .mut_args(|a| a.hide_env_values(true))
            .mut_subcommands(fixed)
    }
    let mut cmd = fixed(Cli::command());
    cmd.build();
    let mut out = String::new();
    let mut section = |title: &str, c: &mut clap::Command| {
        let help = c.render_long_help().to_string();
        let help: Vec<&str> = help.lines().map(str::trim_end).collect();
        out += &format!("### `{title}`\n\n```text\n{}\n```\n\n", help.join("\n"));
    };
    section("tachyon-bpf --help", &mut cmd);
    for sub in ["record", "convert", "top", "dump"] {
        let c = cmd.find_subcommand_mut(sub).unwrap();
        section(&format!("tachyon-bpf {sub} --help"), c);
    }
    out
}

const GENERATED: &str = "<!-- Below: generated from the command line's definition. A unit test \
                         checks it; TACHYON_WRITE_DOCS=1 cargo test -p tachyon-bpf --bin \
                         tachyon-bpf docs_cli rewrites it. -->\n";

/// docs/cli.md's reference is `--help` itself: a change to an option that leaves the page
/// behind fails here.
#[test]
fn docs_cli_page_is_the_help() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/cli.md");
    let page = std::fs::read_to_string(path).unwrap();
    let at = page
        .find(GENERATED)
        .expect("docs/cli.md has the generated reference's marker");
    let want = format!("{}{GENERATED}\n{}", &page[..at], reference());
    let want = want.trim_end().to_string() + "\n";
    if std::env::var_os("TACHYON_WRITE_DOCS").is_some() {
        std::fs::write(path, &want).unwrap();
        return;
    }
    assert!(
        page == want,
        "docs/cli.md's reference differs from --help: run this test with \
         TACHYON_WRITE_DOCS=1 to rewrite it, and commit docs/cli.md"
    );
}

#[test]
fn durations_take_seconds_or_units_alike() {
    for (d, secs) in [
        ("30", 30.0),
        ("30s", 30.0),
        ("0.5", 0.5),
        ("5m", 300.0),
        ("1h", 3600.0),
    ] {
        let c = parse(&["--all", "-d", d]).unwrap();
        assert_eq!(c.run.sampling.duration, Some(secs), "-d {d}");
    }
    for (r, secs) in [("60", 60), ("60s", 60), ("5m", 300)] {
        let c = parse(&[
            "--all-pythons",
            "--continuous",
            "--output-dir",
            "/tmp/x",
            "--rotate",
            r,
        ])
        .unwrap();
        assert_eq!(
            c.run.continuous.rotate,
            Duration::from_secs(secs),
            "--rotate {r}"
        );
    }
    for bad in ["0", "0s", "abc", "2y", "nan", "inf"] {
        let e = parse(&["--all", "-d", bad]).unwrap_err();
        assert!(e.contains("is not a duration"), "{bad}: {e}");
    }
    let e = parse(&[
        "--all-pythons",
        "--continuous",
        "--output-dir",
        "x",
        "--rotate",
        "0.5",
    ])
    .unwrap_err();
    assert!(e.contains("at least 1s"), "{e}");
}

/// The groups' defaults, and `dump`'s typed run, are what the command line gives.
#[test]
fn typed_runs_are_what_the_command_line_says() {
    let parse = |argv: &[&str]| {
        let mut all = vec!["tachyon-bpf"];
        all.extend(argv);
        Cli::try_parse_from(all).unwrap().run
    };
    let none = parse(&[]);
    assert_eq!(
        format!("{:?}", SamplingArgs::default()),
        format!("{:?}", none.sampling)
    );
    assert_eq!(
        format!("{:?}", FileArgs::default()),
        format!("{:?}", none.file)
    );
    for aware in [None, Some("running"), Some("all")] {
        let dump = DumpArgs {
            pid: 42,
            json: false,
            async_aware: aware.map(String::from),
        };
        let mut argv = vec!["--pid", "42", "-m", "wall", "-d", "0.2", "-q"];
        if let Some(w) = aware {
            argv.extend(["--async-aware", w]);
        }
        assert_eq!(
            format!("{:?}", RunArgs::from(&dump)),
            format!("{:?}", parse(&argv))
        );
    }
}

#[test]
fn async_aware_takes_the_same_values_everywhere() {
    let c = parse(&["--all-pythons", "--async-aware"]).unwrap();
    assert_eq!(c.run.python.async_aware.as_deref(), Some("running"));
    let c = parse(&["--all-pythons", "--async-aware", "all"]).unwrap();
    assert_eq!(c.run.python.async_aware.as_deref(), Some("all"));
    let c = parse(&["--async-aware", "--", "python3", "app.py"]).unwrap();
    assert_eq!(c.run.python.async_aware.as_deref(), Some("running"));
    assert_eq!(c.run.target.command, ["python3", "app.py"]);
    for (args, want) in [
        (&["dump", "-p", "1", "--async-aware"][..], "running"),
        (&["dump", "-p", "1", "--async-aware", "all"][..], "all"),
        (&["dump", "--async-aware", "-p", "1"][..], "running"),
    ] {
        let Some(Cmd::Dump(d)) = parse(args).unwrap().cmd else {
            panic!("dump")
        };
        assert_eq!(d.async_aware.as_deref(), Some(want), "{args:?}");
    }
}

#[test]
fn file_mode_keeps_its_old_name() {
    assert_eq!(
        parse(&["--all", "--file-mode", "640"])
            .unwrap()
            .run
            .file
            .file_mode,
        0o640
    );
    assert_eq!(
        parse(&["--all", "--output-mode", "644"])
            .unwrap()
            .run
            .file
            .file_mode,
        0o644
    );
}

#[test]
fn modes_and_formats_by_name() {
    let c = parse(&["--all", "-m", "cpu", "-f", "gecko,pprof"]).unwrap();
    assert_eq!(c.run.sampling.mode, Mode::Cpu);
    assert_eq!(c.run.formats.format, vec![Format::Gecko, Format::Pprof]);
    assert_eq!(parse(&["--all"]).unwrap().run.sampling.mode, Mode::Wall);
    let e = parse(&["--all", "-m", "walls"]).unwrap_err();
    assert!(
        e.contains("possible values: wall, cpu, gil, exception, all"),
        "{e}"
    );
    assert!(parse(&["--all", "-f", "svg"]).is_err());
    let Some(Cmd::Convert(c)) = parse(&["convert", "x.tbpf", "-m", "gil"]).unwrap().cmd else {
        panic!("not convert")
    };
    assert_eq!(c.mode, Some(Mode::Gil));
}

#[test]
fn values_out_of_range_are_refused() {
    assert!(parse_secs("-1").is_err());
    assert!(parse_secs("NaN").is_err());
    assert!(parse_secs("1e12").is_err());
    assert_eq!(parse_secs("2.5"), Ok(2.5));
    assert!(parse_rotate("0s").is_err());
    assert_eq!(parse_rotate("5m"), Ok(Duration::from_secs(300)));
    assert!(parse_push_url("file:///etc/passwd").is_err());
    assert!(parse_push_url("http://").is_err());
    assert!(parse_push_url("https://pyroscope.example:4040").is_ok());
    assert_eq!(parse_mode("640"), Ok(0o640));
    assert!(parse_mode("1777").is_err() && parse_mode("9").is_err());
    assert!(parse(&["--all", "-r", "0"]).is_err());
    assert!(parse(&["--all", "--stack-size", "100"]).is_err());
}
