//! `convert`: a recording written in other formats, or against a baseline (`--diff-against`).
//! No root: everything it needs is in the recording.

use tachyon_bpf::aggregate::Profile;
use tachyon_bpf::output::{self, Format, RunInfo};

use crate::cli::ConvertArgs;
use crate::error::{other, usage, AppError};
use crate::run::open_in_browser;
use crate::sinks;

pub async fn convert(args: ConvertArgs) -> Result<i32, AppError> {
    let (mut profile, mut run) = output::recording::load(&args.input)?;
    if let Some(mode) = args.mode {
        output::recording::select_mode(&mut profile, &mut run, mode)?;
    }
    let base = args.output.clone().unwrap_or_else(|| {
        let s = args.input.to_string_lossy();
        std::path::PathBuf::from(s.strip_suffix(".tbpf").unwrap_or(&s).to_string())
    });
    if let Some(baseline) = &args.diff_against {
        return convert_diff(&args, baseline, &profile, &run, &base);
    }
    let outputs = if args.output.is_none() && args.format.len() <= 1 {
        // One format, no -o: the recording's name with the format's extension.
        let f = args.format.first().copied().unwrap_or(Format::Gecko);
        vec![(
            f,
            std::path::PathBuf::from(format!("{}.{}", base.display(), f.extension())),
        )]
    } else {
        output::output_paths(Some(&base), &args.format)
    };
    output::write_outputs(
        &profile,
        &run,
        &outputs,
        output::WriteOptions::with_mode(args.file_mode),
    )?;
    if !args.quiet {
        let paths: Vec<_> = outputs.into_iter().map(|(_, p)| p).collect();
        sinks::report_written(&paths);
    }
    if args.open {
        open_in_browser(&profile, &run).await?;
    }
    Ok(0)
}

/// `convert`: a recording into other formats.
/// `convert NEW --diff-against BASELINE`: a differential flame graph, or folded stacks with both
/// counts, of the two recordings counted in one mode.
fn convert_diff(
    args: &ConvertArgs,
    baseline: &std::path::Path,
    profile: &Profile,
    run: &RunInfo,
    base: &std::path::Path,
) -> Result<i32, AppError> {
    let format = match args.format.as_slice() {
        [] | [Format::Flamegraph] => Format::Flamegraph,
        [Format::Collapsed] => Format::Collapsed,
        _ => {
            return Err(usage(
                "--diff-against writes one format: flamegraph (the default) or collapsed",
            ))
        }
    };
    if args.open {
        return Err(usage(
            "--diff-against writes a file; --open serves a Gecko profile",
        ));
    }
    let (mut old, mut old_run) = output::recording::load(baseline)?;
    let mode = args.mode.unwrap_or(profile.mode);
    if old.mode != mode {
        output::recording::select_mode(&mut old, &mut old_run, mode).map_err(|_| {
            usage(format!(
                "the baseline was recorded in {} mode and the new recording counts {} mode; \
                 pick a mode both give with --mode",
                old.mode.name(),
                mode.name()
            ))
        })?;
    }
    let d = output::diff::diff(&old, profile);
    let (bytes, ext) = match format {
        Format::Collapsed => (d.to_text().into_bytes(), "folded"),
        _ => (
            d.flamegraph(run)
                .map_err(|e| other(format!("flamegraph: {e}")))?,
            "svg",
        ),
    };
    let path = args
        .output
        .clone()
        .unwrap_or_else(|| std::path::PathBuf::from(format!("{}.diff.{ext}", base.display())));
    output::write_atomic(
        &path,
        &bytes,
        output::WriteOptions::with_mode(args.file_mode),
    )
    .map_err(|e| other(format!("cannot write {}: {e}", path.display())))?;
    if !args.quiet {
        eprintln!(
            "tachyon-bpf: {} samples against a baseline of {}; {:.1}% of the baseline is on call \
             paths that are gone",
            d.totals.1,
            d.totals.0,
            100.0 * d.gone_share()
        );
        eprintln!("tachyon-bpf: the largest changes of total share (baseline -> now):");
        for (name, before, now) in d.changes().iter().take(8) {
            eprintln!(
                "tachyon-bpf: {:>+7.1}  {:5.1}% -> {:5.1}%  {name}",
                100.0 * (now - before),
                100.0 * before,
                100.0 * now
            );
        }
        for (path, share) in d.gone.iter().take(3) {
            let leaf_first: Vec<&str> = path
                .iter()
                .skip(2)
                .rev()
                .take(3)
                .map(String::as_str)
                .collect();
            eprintln!(
                "tachyon-bpf:   gone: {:.1}%  {}",
                100.0 * share,
                leaf_first.join(" <- ")
            );
        }
        sinks::report_written(&[path]);
    }
    Ok(0)
}
