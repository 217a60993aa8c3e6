//! Graceful shutdown: a stream in flight when the drain starts runs to its end, and the
//! listener stops taking new connections.

mod common;
use common::*;

#[test]
fn shutdown_drains_streams_in_flight_and_refuses_new_connections() {
    for d in drivers() {
        // 10 tokens 100 ms apart: the stream outlives the moment shutdown starts.
        let m = mock("slow", |c| {
            c.itl = std::time::Duration::from_millis(100);
            c.tokens = 10;
        });
        let g = gateway_for(d, &[&m], "");
        let addr = g.local_addr();
        let streamer = std::thread::spawn(move || {
            call(addr, &post("/v1/chat/completions", &[], &chat_body(true)))
        });
        // Wait until the engine is generating, then stop the gateway with a 5 s grace.
        wait_for("stream started", SHORT, || m.stats().running == 1);
        let stopper = std::thread::spawn(move || g.shutdown(std::time::Duration::from_secs(5)));
        std::thread::sleep(std::time::Duration::from_millis(300));
        // The listening socket is shut: the kernel refuses new connections.
        assert!(
            std::net::TcpStream::connect(addr).is_err(),
            "{}: new connections are refused while draining",
            driver_name(d)
        );
        let r = streamer.join().unwrap();
        assert_eq!(r.status, 200);
        assert!(r.chunked, "the stream ended with its terminal chunk");
        let events = sse_events(&r.body);
        assert_eq!(
            events.last().unwrap().1,
            "[DONE]",
            "{}: stream completed",
            driver_name(d)
        );
        stopper.join().unwrap();
        assert_eq!(m.stats().aborted, 0, "nothing was cut off");
    }
}

#[test]
fn a_stream_still_running_when_the_grace_ends_gets_an_error_event_first() {
    for d in drivers() {
        // 100 tokens 100 ms apart: 10 s, far past the 1 s grace.
        let m = mock("long", |c| {
            c.itl = std::time::Duration::from_millis(100);
            c.tokens = 100;
        });
        let g = gateway_for(d, &[&m], "");
        let addr = g.local_addr();
        let streamer = std::thread::spawn(move || {
            let mut c = Client::connect(addr);
            c.send(&post("/v1/chat/completions", &[], &chat_body(true)));
            let (status, _) = c.head().unwrap();
            let mut body = Vec::new();
            let terminal = loop {
                match c.chunk() {
                    Ok(Some(data)) => body.extend_from_slice(&data),
                    Ok(None) => break true,
                    Err(_) => break false,
                }
            };
            (status, body, terminal)
        });
        wait_for("stream started", SHORT, || m.stats().running == 1);
        g.shutdown(std::time::Duration::from_secs(1));
        let (status, body, terminal) = streamer.join().unwrap();
        assert_eq!(status, 200);
        assert!(
            !terminal,
            "{}: a cut stream has no terminal chunk",
            driver_name(d)
        );
        let events = sse_events(&body);
        let last = &events.last().unwrap().1;
        assert!(
            last.contains("\"code\":\"gateway_shutting_down\""),
            "{}: the last event says why the stream ended: {last}",
            driver_name(d)
        );
        assert!(events.len() > 2, "tokens were relayed before the cut");
    }
}
