//! RESP spoken by hand to a test server: one command, its reply as text, and what a
//! server holds (every key's contents, every command's calls), for checking the store
//! from outside without the `redis` crate.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Sends one command over RESP; the reader is at the start of the reply.
fn send(port: u16, args: &[&str]) -> Result<BufReader<TcpStream>, String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    let mut request = format!("*{}\r\n", args.len());
    for a in args {
        request.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    stream
        .write_all(request.as_bytes())
        .map_err(|e| e.to_string())?;
    Ok(BufReader::new(stream))
}

fn read_line(reader: &mut BufReader<TcpStream>) -> Result<String, String> {
    let mut line = String::new();
    reader.read_line(&mut line).map_err(|e| e.to_string())?;
    Ok(line.trim_end().to_owned())
}

/// The body of a bulk string whose header line (`$<len>`) was just read.
fn read_bulk(reader: &mut BufReader<TcpStream>, len: &str) -> Result<String, String> {
    if len == "-1" {
        return Ok(String::new());
    }
    let len: usize = len.parse().map_err(|_| format!("bad length {len}"))?;
    let mut buf = vec![0; len + 2];
    reader.read_exact(&mut buf).map_err(|e| e.to_string())?;
    buf.truncate(len);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Sends one command over RESP and returns a simple reply as text (status, integer or
/// bulk string); `Err` for an error reply, an array reply (see [`command_list`]) or an
/// I/O failure. Enough to check the support itself; store code uses the `redis` crate.
pub fn command(port: u16, args: &[&str]) -> Result<String, String> {
    let mut reader = send(port, args)?;
    let line = read_line(&mut reader)?;
    match line.split_at(1.min(line.len())) {
        ("+", rest) | (":", rest) => Ok(rest.to_owned()),
        ("-", rest) => Err(rest.to_owned()),
        ("$", len) => read_bulk(&mut reader, len),
        _ => Err(format!("unexpected reply {line:?}")),
    }
}

/// Sends one command whose reply is an array of bulk strings (KEYS, HGETALL, ZRANGE…)
/// and returns its elements; a single bulk string comes back as one element. Panics on
/// anything else, so a test cannot mistake a failed call for an empty answer.
pub fn command_list(port: u16, args: &[&str]) -> Vec<String> {
    let mut reader = send(port, args).unwrap();
    let line = read_line(&mut reader).unwrap();
    match line.split_at(1.min(line.len())) {
        ("$", len) => vec![read_bulk(&mut reader, len).unwrap()],
        ("*", n) => (0..n.parse::<usize>().unwrap())
            .map(|_| {
                let header = read_line(&mut reader).unwrap();
                let len = header.strip_prefix('$').expect("an array of bulk strings");
                read_bulk(&mut reader, len).unwrap()
            })
            .collect(),
        _ => panic!("{args:?}: unexpected reply {line:?}"),
    }
}

/// Every key with its contents as text (hash fields and values, sorted-set members, list
/// elements, string values, and the raw DUMP): for checking what the store keeps.
pub fn contents(port: u16) -> Vec<(String, String)> {
    command_list(port, &["KEYS", "*"])
        .into_iter()
        .map(|key| {
            let values = match command(port, &["TYPE", &key]).unwrap().as_str() {
                "hash" => command_list(port, &["HGETALL", &key]).join(" "),
                "zset" => command_list(port, &["ZRANGE", &key, "0", "-1"]).join(" "),
                "list" => command_list(port, &["LRANGE", &key, "0", "-1"]).join(" "),
                _ => command(port, &["GET", &key]).unwrap(),
            };
            let dump = command_list(port, &["DUMP", &key]).join("");
            (key.clone(), format!("{values}\n{dump}"))
        })
        .collect()
}

/// Calls of every Redis command so far, from `INFO commandstats` (without INFO itself,
/// which reading them adds to).
pub fn command_calls(port: u16) -> Vec<(String, u64)> {
    command(port, &["INFO", "commandstats"])
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .filter(|(name, _)| name != "info")
        .collect()
}
