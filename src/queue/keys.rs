//! Placeholder (replaced by the key layout module).
pub struct QueueKeys {
    pub queue: Vec<u8>,
    pub leases: Vec<u8>,
    pub mleases: Vec<u8>,
    pub msgs: Vec<u8>,
    pub ids: Vec<u8>,
    pub retry: Vec<u8>,
    pub dead: Vec<u8>,
}
impl QueueKeys {
    pub fn new(queue: &[u8], _dead: Option<&str>) -> QueueKeys {
        let k = |s: &str| [queue, s.as_bytes()].concat();
        QueueKeys { queue: queue.to_vec(), leases: k(":l"), mleases: k(":m"), msgs: k(":s"), ids: k(":i"), retry: k(":r"), dead: k(":d") }
    }
}
