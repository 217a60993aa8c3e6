use super::*;

const WRK: &str = "Running 2s test @ http://127.0.0.1:19100/v1/chat/completions
  1 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   760.12us  200.00us   5.01ms   90.00%
    Req/Sec    42.01k     1.00k   44.00k    80.00%
  Latency Distribution
     50%  700.00us
     75%  800.00us
     90%    1.00ms
     99%    1.52ms
  84000 requests in 2.00s, 100.00MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 3
Requests/sec:  42000.50
Transfer/sec:     50.00MB
";

#[test]
fn wrk_parses() {
    let m = parse_wrk(WRK).unwrap();
    assert_eq!(m["rps"], json!(42000.5));
    assert_eq!(m["p50_us"], json!(700.0));
    assert_eq!(m["p99_us"], json!(1520.0));
    assert_eq!(m["requests"], json!(84000.0));
    assert_eq!(m["errors"], json!(6.0));
    assert!(parse_wrk("unable to connect").is_err());
}

#[test]
fn oha_parses() {
    let v = json!({"summary": {"total": 2.0, "requestsPerSec": 100.0},
            "latencyPercentiles": {"p50": 0.0005, "p99": 0.002, "p99.9": 0.004},
            "statusCodeDistribution": {"200": 190, "502": 4}, "errorDistribution": {"aborted": 6}});
    let m = parse_oha(&v).unwrap();
    assert_eq!(m["rps"], json!(95.0));
    assert_eq!(m["errors"], json!(10.0));
    assert_eq!(m["p999_us"], json!(4000.0));
}
