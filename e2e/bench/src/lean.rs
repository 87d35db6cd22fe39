//! The append loop's HTTP/1.1 client: each writer owns its keep-alive connections and writes
//! a request, then reads the response, on its own task, with no pool and no connection task in
//! between (as `wrk` does). On the 2-core bench machine the load generator shares the CPU with
//! the server it measures; a pooled client (hyper's) spent about a third of the machine on
//! hand-offs between tasks, which showed up as the server's latency.

use std::collections::HashMap;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::client::Error;

/// What the append loop needs of a response.
pub struct Answer {
    pub status: u16,
    pub location: Option<String>,
}

/// One writer's connections, by `host:port`.
#[derive(Default)]
pub struct Connections {
    open: HashMap<String, Connection>,
}

impl Connections {
    /// Sends one request to `url` (`http://host:port/path`) and reads its whole response. A
    /// connection that fails is dropped and the request fails; the next one reconnects.
    pub async fn send(
        &mut self,
        method: &str,
        url: &str,
        content_type: &str,
        body: &[u8],
    ) -> Result<Answer, Error> {
        let (authority, path) = split_url(url)?;
        let connection = match self.open.get_mut(authority) {
            Some(connection) => connection,
            None => {
                let connection = Connection::open(authority).await?;
                self.open.entry(authority.to_owned()).or_insert(connection)
            }
        };
        let result = connection
            .exchange(method, authority, path, content_type, body)
            .await;
        if result.is_err() {
            self.open.remove(authority);
        }
        result
    }
}

fn split_url(url: &str) -> Result<(&str, &str), Error> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("not an http:// URL: {url}"))?;
    Ok(match rest.find('/') {
        Some(slash) => (&rest[..slash], &rest[slash..]),
        None => (rest, "/"),
    })
}

struct Connection {
    stream: TcpStream,
    request: Vec<u8>,
    /// Bytes read and not yet consumed.
    input: Vec<u8>,
}

impl Connection {
    async fn open(authority: &str) -> Result<Self, Error> {
        let stream = TcpStream::connect(authority).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            request: Vec::with_capacity(1024),
            input: Vec::with_capacity(4096),
        })
    }

    async fn exchange(
        &mut self,
        method: &str,
        authority: &str,
        path: &str,
        content_type: &str,
        body: &[u8],
    ) -> Result<Answer, Error> {
        use std::io::Write;
        self.request.clear();
        write!(
            self.request,
            "{method} {path} HTTP/1.1\r\nhost: {authority}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )?;
        self.request.extend_from_slice(body);
        self.stream.write_all(&self.request).await?;
        self.read_response().await
    }

    async fn read_response(&mut self) -> Result<Answer, Error> {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut response = httparse::Response::new(&mut headers);
            if let httparse::Status::Complete(head_len) = response.parse(&self.input)? {
                let status = response.code.unwrap_or(0);
                let mut length = 0usize;
                let mut chunked = false;
                let mut location = None;
                for header in response.headers.iter() {
                    if header.name.eq_ignore_ascii_case("content-length") {
                        length = std::str::from_utf8(header.value)?.trim().parse()?;
                    } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
                        chunked = header.value.eq_ignore_ascii_case(b"chunked");
                    } else if header.name.eq_ignore_ascii_case("location") {
                        location = Some(std::str::from_utf8(header.value)?.to_owned());
                    }
                }
                self.input.drain(..head_len);
                if chunked {
                    self.skip_chunked_body().await?;
                } else {
                    self.fill(length).await?;
                    self.input.drain(..length);
                }
                return Ok(Answer { status, location });
            }
            self.read_more().await?;
        }
    }

    /// Reads until at least `n` bytes are buffered.
    async fn fill(&mut self, n: usize) -> Result<(), Error> {
        while self.input.len() < n {
            self.read_more().await?;
        }
        Ok(())
    }

    async fn read_more(&mut self) -> Result<(), Error> {
        let start = self.input.len();
        self.input.resize(start + 4096, 0);
        let read = self.stream.read(&mut self.input[start..]).await;
        let n = match read {
            Ok(n) => n,
            Err(error) => {
                self.input.truncate(start);
                return Err(error.into());
            }
        };
        self.input.truncate(start + n);
        if n == 0 {
            return Err("the server closed the connection".into());
        }
        Ok(())
    }

    async fn skip_chunked_body(&mut self) -> Result<(), Error> {
        loop {
            let line_end = loop {
                if let Some(end) = self.input.windows(2).position(|w| w == b"\r\n") {
                    break end;
                }
                self.read_more().await?;
            };
            let size_text = std::str::from_utf8(&self.input[..line_end])?;
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)?;
            self.input.drain(..line_end + 2);
            // The chunk and its CRLF (the last chunk has no data, just the final CRLF).
            self.fill(size + 2).await?;
            self.input.drain(..size + 2);
            if size == 0 {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_authority_and_path() {
        let (authority, path) = split_url("http://127.0.0.1:4437/b/s?x=1").unwrap();
        assert_eq!((authority, path), ("127.0.0.1:4437", "/b/s?x=1"));
        assert_eq!(split_url("http://h:1").unwrap(), ("h:1", "/"));
        assert!(split_url("https://h/x").is_err());
    }
}
