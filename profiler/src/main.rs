use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use gpuflame::cli::{Cli, Command};
use gpuflame::{convert, record, UserError};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    // Buffers of a MiB and more (a file's .eh_frame, a table's rows) are mmapped, and go back to
    // the system when freed. glibc raises this threshold after such a buffer is freed, so the
    // next ones came from the heap and stayed there as free space: on a node of PyTorch ranks,
    // 24 MiB of the agent's RSS was malloc's free space after the tables were built.
    // SAFETY: mallopt only sets an allocator parameter; no allocation has been handed out that
    // depends on it.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
    let cli = Cli::parse();
    let default_level = match cli.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level)))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .without_time()
        .init();

    gpuflame_symbolizer::configure(gpuflame_symbolizer::DebugConfig { debug_dirs: cli.debug_dirs.clone(), ..gpuflame_symbolizer::DebugConfig::from_env() });
    // The files of sampled modules stay open until the recording is symbolized.
    if let Err(e) = gpuflame_elfread::raise_fd_limit() {
        tracing::warn!(error = %e, "cannot raise the limit on open files");
    }
    let result = match &cli.command {
        Command::Record(args) => args.options().map_err(anyhow::Error::from).and_then(|o| record::run(&o)),
        Command::Agent(args) => gpuflame::agent::run(args),
        Command::CuptiLibrary { path } => gpuflame::cuda::injection::write_to(path)
            .map(|()| {
                println!("start the service with {}={}", gpuflame::cuda::injection::INJECTION_VAR, path.display());
                0
            })
            .map_err(|e| UserError(format!("cannot write the CUPTI library: {e}")).into()),
        Command::Convert(args) => {
            convert::run(&args.input, &args.output, args.format.as_deref(), args.frequency, gpuflame::cli::detail(args.lines), &args.conditions).map(|()| 0)
        }
        Command::Diff(args) => convert::diff(args).map(|()| 0),
        Command::Dump(args) => args.options().map_err(anyhow::Error::from).and_then(|o| gpuflame::dump::run(&o)),
    };
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            if let Some(user) = e.downcast_ref::<UserError>() {
                eprintln!("gpuflame: error: {user}");
                ExitCode::from(2)
            } else {
                eprintln!("gpuflame: error: {e:#}");
                ExitCode::from(1)
            }
        }
    }
}
