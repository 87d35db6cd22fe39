//! The load generator's HTTP/1.1 client: each writer owns its keep-alive connections and
//! writes a request, then reads the response, on its own task, with no pool and no connection
//! task in between (as `wrk` does); each SSE subscriber reads its event stream the same way.
//! On the 2-core bench machine the load generator shares the CPU with the server it measures;
//! a pooled client (hyper's) spent about a third of the machine on hand-offs between tasks,
//! which showed up as the server's latency.

use std::collections::HashMap;

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::client::Error;

/// What the load generator needs of a response.
pub struct Answer {
    pub status: u16,
    pub location: Option<String>,
    pub next_offset: Option<String>,
    pub cursor: Option<String>,
    pub body: Vec<u8>,
}

/// One writer's connections, by `host:port`; `https://` ones over TLS with `tls`.
#[derive(Default)]
pub struct Connections {
    open: HashMap<String, Connection>,
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl Connections {
    pub fn new(tls: Option<Arc<rustls::ClientConfig>>) -> Self {
        Self {
            open: HashMap::new(),
            tls,
        }
    }

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
        let tls = if url.starts_with("https://") {
            Some(self.tls.clone().ok_or("an https:// URL, and no --ca")?)
        } else {
            None
        };
        let connection = match self.open.get_mut(authority) {
            Some(connection) => connection,
            None => {
                let connection = Connection::open(authority, tls).await?;
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
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("not an http:// or https:// URL: {url}"))?;
    Ok(match rest.find('/') {
        Some(slash) => (&rest[..slash], &rest[slash..]),
        None => (rest, "/"),
    })
}

/// A connection's byte stream: TCP, or TLS over it.
trait Wire: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Wire for T {}

struct Connection {
    stream: Box<dyn Wire>,
    request: Vec<u8>,
    /// Bytes read and not yet consumed.
    input: Vec<u8>,
}

impl Connection {
    async fn open(authority: &str, tls: Option<Arc<rustls::ClientConfig>>) -> Result<Self, Error> {
        let tcp = TcpStream::connect(authority).await?;
        tcp.set_nodelay(true)?;
        let stream: Box<dyn Wire> = match tls {
            Some(config) => {
                let host = authority
                    .rsplit_once(':')
                    .map_or(authority, |(host, _)| host);
                let name = rustls::pki_types::ServerName::try_from(host.to_owned())?;
                Box::new(
                    tokio_rustls::TlsConnector::from(config)
                        .connect(name, tcp)
                        .await?,
                )
            }
            None => Box::new(tcp),
        };
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
                let mut answer = Answer {
                    status,
                    location: None,
                    next_offset: None,
                    cursor: None,
                    body: Vec::new(),
                };
                for header in response.headers.iter() {
                    let text = || std::str::from_utf8(header.value).map(str::to_owned);
                    if header.name.eq_ignore_ascii_case("content-length") {
                        length = std::str::from_utf8(header.value)?.trim().parse()?;
                    } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
                        chunked = header.value.eq_ignore_ascii_case(b"chunked");
                    } else if header.name.eq_ignore_ascii_case("location") {
                        answer.location = Some(text()?);
                    } else if header.name.eq_ignore_ascii_case("stream-next-offset") {
                        answer.next_offset = Some(text()?);
                    } else if header.name.eq_ignore_ascii_case("stream-cursor") {
                        answer.cursor = Some(text()?);
                    }
                }
                self.input.drain(..head_len);
                if chunked {
                    self.read_chunked_body(&mut answer.body).await?;
                } else {
                    self.fill(length).await?;
                    answer.body.extend(self.input.drain(..length));
                }
                return Ok(answer);
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

    async fn read_chunked_body(&mut self, body: &mut Vec<u8>) -> Result<(), Error> {
        let mut chunked = Chunked::default();
        while !chunked.ended {
            if !chunked.decode(&mut self.input, body)? {
                self.read_more().await?;
            }
        }
        Ok(())
    }
}

/// The chunked transfer coding, decoded as it arrives.
#[derive(Default)]
struct Chunked {
    /// What is left of the current chunk, its closing CRLF included; 0 between chunks.
    left: usize,
    /// The current chunk is the last, empty one.
    last: bool,
    ended: bool,
}

impl Chunked {
    /// Moves the data in `input` to `out`; `false` when more input is needed first.
    fn decode(&mut self, input: &mut Vec<u8>, out: &mut Vec<u8>) -> Result<bool, Error> {
        if self.ended {
            return Ok(true);
        }
        if self.left == 0 {
            let Some(line_end) = input.windows(2).position(|w| w == b"\r\n") else {
                return Ok(false);
            };
            let size_text = std::str::from_utf8(&input[..line_end])?;
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)?;
            input.drain(..line_end + 2);
            self.last = size == 0;
            self.left = size + 2;
        }
        if input.is_empty() {
            return Ok(false);
        }
        let taken = self.left.min(input.len());
        // The chunk's data, without the CRLF that closes it.
        let data = taken.min(self.left.saturating_sub(2));
        out.extend_from_slice(&input[..data]);
        input.drain(..taken);
        self.left -= taken;
        self.ended = self.last && self.left == 0;
        Ok(true)
    }
}

/// A response body read as it arrives, for event streams.
pub struct EventStream {
    connection: Connection,
    /// `None`: the body ends when the server closes the connection.
    chunked: Option<Chunked>,
    ended: bool,
}

impl EventStream {
    /// Sends `GET url` and reads the response head; anything but a 200 is an error.
    pub async fn open(url: &str) -> Result<Self, Error> {
        use std::io::Write;
        let (authority, path) = split_url(url)?;
        let mut connection = Connection::open(authority, None).await?;
        write!(
            connection.request,
            "GET {path} HTTP/1.1\r\nhost: {authority}\r\naccept: text/event-stream\r\n\r\n"
        )?;
        connection.stream.write_all(&connection.request).await?;
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut response = httparse::Response::new(&mut headers);
            if let httparse::Status::Complete(head_len) = response.parse(&connection.input)? {
                if response.code != Some(200) {
                    return Err(format!("GET {url}: status {:?}", response.code).into());
                }
                let chunked = response.headers.iter().any(|h| {
                    h.name.eq_ignore_ascii_case("transfer-encoding")
                        && h.value.eq_ignore_ascii_case(b"chunked")
                });
                connection.input.drain(..head_len);
                return Ok(Self {
                    connection,
                    chunked: chunked.then(Chunked::default),
                    ended: false,
                });
            }
            connection.read_more().await?;
        }
    }

    /// Appends the body bytes that have arrived to `out`, waiting for some; `false` once the
    /// body has ended.
    pub async fn next(&mut self, out: &mut Vec<u8>) -> Result<bool, Error> {
        let start = out.len();
        loop {
            if self.ended {
                return Ok(out.len() > start);
            }
            if !self.decode(out)? {
                if out.len() > start {
                    return Ok(true);
                }
                if self.connection.read_more().await.is_err() {
                    // A body without a length ends when the server closes the connection.
                    self.ended = true;
                }
            }
        }
    }

    /// Decodes what is buffered into `out`; `false` when more must be read first.
    fn decode(&mut self, out: &mut Vec<u8>) -> Result<bool, Error> {
        let input = &mut self.connection.input;
        match &mut self.chunked {
            Some(chunked) => {
                let progressed = chunked.decode(input, out)?;
                self.ended = chunked.ended;
                Ok(progressed)
            }
            None if input.is_empty() => Ok(false),
            None => {
                out.append(input);
                Ok(true)
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
        assert_eq!(split_url("https://h:2/x").unwrap(), ("h:2", "/x"));
        assert!(split_url("ftp://h/x").is_err());
    }

    #[test]
    fn a_chunked_body_is_read_to_its_end_and_no_further() {
        let mut chunked = Chunked::default();
        let mut input = b"3\r\nabc\r\n0\r\n\r\nHTTP/1.1 204".to_vec();
        let mut out = Vec::new();
        while !chunked.ended {
            assert!(
                chunked.decode(&mut input, &mut out).unwrap(),
                "all of it is here"
            );
        }
        assert_eq!(out, b"abc");
        assert_eq!(
            input, b"HTTP/1.1 204",
            "the next response stays for the connection"
        );
    }

    /// A real server on loopback that sends its chunks split at every awkward place.
    #[tokio::test]
    async fn event_streams_are_decoded_however_the_chunks_arrive() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let body = "5\r\nhello\r\n1;ext=1\r\n \r\n6\r\nworld\n\r\n0\r\n\r\n";
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{body}"
        );
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 1024];
            let _ = socket.read(&mut request).await.unwrap();
            for piece in response.as_bytes().chunks(3) {
                socket.write_all(piece).await.unwrap();
                socket.flush().await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        });
        let mut stream = EventStream::open(&format!("http://{addr}/s?live=sse"))
            .await
            .unwrap();
        let mut out = Vec::new();
        while stream.next(&mut out).await.unwrap() {}
        assert_eq!(String::from_utf8(out).unwrap(), "hello world\n");
    }
}
