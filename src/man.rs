//! The manual page: clap_mangen's sections from the command-line definition,
//! then the ones a reader of `man ackproxy` looks for and a flag list cannot
//! give (the proxy's own Redis commands, files, environment, signals, exit
//! status, examples). The environment list and the QUEUE subcommands come
//! from the flags and from `QUEUE HELP`, so they cannot drift from the binary.

use clap_mangen::roff::{bold, italic, roman, Inline, Roff};

/// The page, for `ackproxy generate man DIR`.
pub fn page(cmd: clap::Command) -> std::io::Result<Vec<u8>> {
    let man = clap_mangen::Man::new(cmd.clone());
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    man.render_options_section(&mut out)?;
    let mut roff = Roff::new();
    commands(&mut roff);
    files(&mut roff);
    environment(&mut roff, &cmd);
    signals(&mut roff);
    exit_status(&mut roff);
    examples(&mut roff);
    see_also(&mut roff);
    roff.to_writer(&mut out)?;
    man.render_version_section(&mut out)?;
    Ok(out)
}

fn section(roff: &mut Roff, name: &str) {
    roff.control("SH", [name]);
}

/// A tagged paragraph: `tag` on its own line, `text` indented below.
fn item(roff: &mut Roff, tag: impl Into<Vec<Inline>>, text: &str) {
    roff.control("TP", []);
    roff.text(tag);
    roff.text([roman(text)]);
}

fn paragraph(roff: &mut Roff, text: &str) {
    roff.control("PP", []);
    roff.text([roman(text)]);
}

fn commands(roff: &mut Roff) {
    section(roff, "COMMANDS");
    paragraph(
        roff,
        "Besides every Redis command, which passes through, clients of the proxy \
         can send these, on keys that a [[queue]] rule names. A pop (RPOP, LPOP, \
         BRPOP, BLPOP, RPOPLPUSH, BRPOPLPUSH, LMOVE, BLMOVE, LMPOP, BLMPOP) on such \
         a key leases the message it returns until it is acknowledged.",
    );
    item(
        roff,
        [
            bold("ACK"),
            roman(" "),
            italic("queue id"),
            roman(" [id ...]"),
        ],
        "Releases the leases of the messages with these ids: the number released.",
    );
    item(
        roff,
        [
            bold("NACK"),
            roman(" "),
            italic("queue id"),
            roman(" [id ...] [DELAY "),
            italic("ms"),
            roman("]"),
        ],
        "Returns leased messages to the queue, at once (or after the rule's retry \
         backoff) or after ms milliseconds; past max_deliveries, to the dead letters.",
    );
    roff.control("TP", []);
    roff.text([
        bold("QUEUE"),
        roman(" "),
        italic("operation"),
        roman(" ..."),
    ]);
    // QUEUE HELP's lines: an operation, then its description indented.
    let mut lines = ackproxy::queue::HELP.iter().skip(1).peekable();
    roff.control("RS", []);
    while let Some(line) = lines.next() {
        if line.starts_with("Outside QUEUE") {
            break;
        }
        if line.starts_with(' ') {
            continue;
        }
        let mut text = String::new();
        while let Some(more) = lines.peek().filter(|l| l.starts_with(' ')) {
            if !text.is_empty() {
                text.push(' ');
            }
            text.push_str(more.trim());
            lines.next();
        }
        item(roff, [bold(*line)], &text);
    }
    roff.control("RE", []);
}

fn files(roff: &mut Roff) {
    section(roff, "FILES");
    item(
        roff,
        [italic("/etc/ackproxy/ackproxy.toml")],
        "The configuration the packaged systemd unit passes with --config: settings, \
         and the [[queue]] rules. SIGHUP reloads its rules, limits and upstream \
         credentials.",
    );
    item(
        roff,
        [italic("/etc/ackproxy/ackproxy.env")],
        "ACKPROXY_* variables for the systemd unit (mode 0600), for secrets such as \
         ACKPROXY_REQUIREPASS and ACKPROXY_ADMIN_TOKEN that do not belong in the \
         configuration file.",
    );
    item(
        roff,
        [italic("/var/lib/ackproxy")],
        "The private redis-server's files under the systemd unit, when no upstream is \
         configured and [embedded] persistence is on.",
    );
    item(
        roff,
        [italic("/usr/share/doc/ackproxy/")],
        "The documentation: README.md, docs/*.md, the commented example configuration \
         and the framework configurations.",
    );
}

/// Every flag that a variable can set, from the definition itself.
fn environment(roff: &mut Roff, cmd: &clap::Command) {
    section(roff, "ENVIRONMENT");
    paragraph(
        roff,
        "Each setting can come from a variable; a flag wins over its variable, and \
         both over the configuration file.",
    );
    for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
        let (Some(var), Some(long)) = (arg.get_env(), arg.get_long()) else {
            continue;
        };
        item(
            roff,
            [bold(var.to_string_lossy().into_owned())],
            &format!("As --{long}."),
        );
    }
    item(
        roff,
        [bold("RUST_LOG")],
        "The log filter, as tracing-subscriber reads it (default info), e.g. \
         RUST_LOG=ackproxy=debug.",
    );
}

fn signals(roff: &mut Roff) {
    section(roff, "SIGNALS");
    item(
        roff,
        [bold("SIGHUP")],
        "Reloads the configuration file: the [[queue]] rules, [limits] and the upstream \
         credentials. A file that does not load changes nothing and is logged on one \
         line; ackproxy_config_reload_success says which happened.",
    );
    item(
        roff,
        [bold("SIGTERM"), roman(", "), bold("SIGINT")],
        "Stops accepting clients, lets the replies in flight out (at most 10 s), stops \
         the private redis-server if there is one, and exits 0. Leases held by clients \
         stay in Redis and run out as usual.",
    );
}

fn exit_status(roff: &mut Roff) {
    section(roff, "EXIT STATUS");
    item(
        roff,
        [bold("0")],
        "Stopped by a signal; or --check-config found the configuration valid.",
    );
    item(
        roff,
        [bold("1")],
        "The proxy could not start or stopped on an error (an address taken, redis-server \
         missing or failing to start).",
    );
    item(
        roff,
        [bold("2")],
        "The configuration is invalid (one line on stderr names the file, line and key), \
         or --check-bind found an address that cannot be bound.",
    );
}

fn examples(roff: &mut Roff) {
    section(roff, "EXAMPLES");
    let examples: [(&str, &str); 5] = [
        (
            "Run on a private redis-server with the rules of a file:",
            "ackproxy --config /etc/ackproxy/ackproxy.toml",
        ),
        (
            "Put the proxy in front of a Redis of your own:",
            "ackproxy --upstream 10.0.0.5:6379 --listen 0.0.0.0:6380",
        ),
        (
            "Check a file, also while its proxy runs, then reload it:",
            "ackproxy --config /etc/ackproxy/ackproxy.toml --check-config && systemctl reload ackproxy",
        ),
        (
            "A worker's side: pop a job (leased), then acknowledge it by its id:",
            "redis-cli -p 6380 RPOP jobs\nredis-cli -p 6380 ACK jobs 42",
        ),
        (
            "What a queue holds and how it fares:",
            "redis-cli -p 6380 QUEUE INFO jobs",
        ),
    ];
    for (what, how) in examples {
        paragraph(roff, what);
        roff.control("RS", []);
        roff.control("nf", []);
        for line in how.lines() {
            roff.text([roman(line)]);
        }
        roff.control("fi", []);
        roff.control("RE", []);
    }
}

fn see_also(roff: &mut Roff) {
    section(roff, "SEE ALSO");
    roff.text([
        bold("redis-server"),
        roman("(1), "),
        bold("redis-cli"),
        roman("(1), "),
        bold("systemctl"),
        roman("(1)"),
    ]);
}
