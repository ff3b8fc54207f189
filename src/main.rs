use std::process::ExitCode;

use clap::{Parser, Subcommand};
use redpilot::telemetry::{self, LogFormat};

/// Redpilot: a Kubernetes operator for Redis and Valkey.
#[derive(Parser, Debug)]
#[command(name = "redpilot", version = redpilot::VERSION, about)]
struct Cli {
    /// Log format.
    #[arg(long, global = true, env = "REDPILOT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Json)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the version and exit.
    Version,
    /// Print the CustomResourceDefinitions as YAML, or write them to a file.
    Crd {
        /// Write to this file instead of standard output.
        #[arg(long)]
        output: Option<std::path::PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init(cli.log_format);
    match cli.command {
        Command::Version => {
            println!("redpilot {}", redpilot::VERSION);
            ExitCode::SUCCESS
        }
        Command::Crd { output } => match write_crds(output.as_deref()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("redpilot crd: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

fn write_crds(output: Option<&std::path::Path>) -> Result<(), Box<dyn std::error::Error>> {
    let yaml = redpilot::api::crds_yaml()?;
    match output {
        Some(path) => std::fs::write(path, yaml)?,
        None => print!("{yaml}"),
    }
    Ok(())
}
