use clap::Parser;

fn main() {
    let cli = ackproxy::config::Cli::parse();
    if let Err(e) = ackproxy::config::Config::load(&cli) {
        eprintln!("ackproxy: {e}");
        std::process::exit(2);
    }
}
