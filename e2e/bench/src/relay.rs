//! `ursula-bench relay`: the cheapest proxy there is, as a baseline for the gateway. Each
//! client connection gets its own connection to the upstream, and bytes are copied both ways
//! as they come, without reading a single HTTP header. Whatever a request costs through it is
//! the price of one more process and one more loopback hop, which any front door pays.

use tokio::net::{TcpListener, TcpStream};

pub async fn run(listen: &str, upstream: &str) -> Result<String, crate::client::Error> {
    let listener = TcpListener::bind(listen).await?;
    eprintln!("relay: {listen} -> {upstream}");
    loop {
        let mut client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(error) => {
                // Out of file descriptors, say: the relay stays up for the connections it has.
                eprintln!("relay: accept: {error}");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let upstream = upstream.to_owned();
        tokio::spawn(async move {
            let Ok(mut server) = TcpStream::connect(&upstream).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        });
    }
}
