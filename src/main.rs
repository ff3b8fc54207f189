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
}

fn main() {
    let cli = Cli::parse();
    telemetry::init(cli.log_format);
    match cli.command {
        Command::Version => {
            println!("redpilot {}", redpilot::VERSION);
            tracing::debug!(version = redpilot::VERSION, "version printed");
        }
    }
}
