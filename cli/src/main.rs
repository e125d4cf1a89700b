fn main() {
    println!("retrywise {}", retrywise::version());
}
