//! Opens N client connections to an address, sends one PING on each and
//! reads the PONG, then holds them all open for a while: the load that
//! `bench/scripts/run.sh` measures the proxy's memory under.
//!
//! usage: idle_conns ADDR N SECONDS

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let (Some(addr), Some(n), Some(secs)) = (args.first(), args.get(1), args.get(2)) else {
        eprintln!("usage: idle_conns ADDR N SECONDS");
        std::process::exit(2);
    };
    let n: usize = n.parse().expect("N");
    let secs: u64 = secs.parse().expect("SECONDS");
    let mut conns = Vec::with_capacity(n);
    for i in 0..n {
        let mut s = match TcpStream::connect(addr) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("connection {i}: {e}");
                std::process::exit(1);
            }
        };
        s.write_all(b"PING\r\n").expect("write");
        conns.push(s);
    }
    for (i, s) in conns.iter_mut().enumerate() {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 7];
        if s.read_exact(&mut buf).is_err() || &buf != b"+PONG\r\n" {
            eprintln!("connection {i}: no PONG");
            std::process::exit(1);
        }
    }
    println!("holding {n} connections for {secs} s");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(secs));
}
