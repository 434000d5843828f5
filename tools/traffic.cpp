// flashattn traffic: the bytes each algorithm moves through main memory, forward and backward,
// for a sweep of N — the analytic count of docs/traffic-model.md (measured counters beside it
// where a backend provides them).
#include <cstdio>

#include "commands.hpp"
#include "traffic_model.hpp"

namespace flashattn::tools {

int run_traffic(const TrafficArgs& a) {
  const Device device = parse_device(a.device);
  if (a.format != "table" && a.format != "json" && a.format != "csv")
    throw Error("flashattn traffic: --format: expected table, json or csv, got " + a.format);
  struct Row {
    int64_t n;
    Traffic sf, ff, sb, fb, cf, cb;
  };
  std::vector<Row> rows;
  for (int64_t n : a.seqlens) {
    if (n < 1) throw Error("flashattn traffic: --seqlen: expected values >= 1, got " + std::to_string(n));
    Config c;
    c.device = device;
    c.dtype = parse_dtype(a.dtype, device);
    c.batch = a.batch;
    c.heads = a.heads;
    c.heads_kv = a.heads_kv > 0 ? a.heads_kv : a.heads;
    c.head_dim = a.head_dim;
    c.seqlen_q = c.seqlen_k = n;
    c.causal = a.causal;
    rows.push_back({n, forward_traffic(c, Algorithm::standard), forward_traffic(c, Algorithm::flash),
                    backward_traffic(c, Algorithm::standard), backward_traffic(c, Algorithm::flash),
                    compulsory_forward(c), compulsory_backward(c)});
  }
  if (a.format == "json") {
    std::printf("[\n");
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      auto t = [](const Traffic& x) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "{\"read\":%.0f,\"write\":%.0f}", x.read, x.write);
        return std::string(buf);
      };
      std::printf("  {\"seqlen\":%lld,\"source\":\"model\",\"forward\":{\"standard\":%s,\"flash\":%s,\"compulsory\":%s},"
                  "\"backward\":{\"standard\":%s,\"flash\":%s,\"compulsory\":%s}}%s\n",
                  (long long)r.n, t(r.sf).c_str(), t(r.ff).c_str(), t(r.cf).c_str(), t(r.sb).c_str(), t(r.fb).c_str(),
                  t(r.cb).c_str(), i + 1 < rows.size() ? "," : "");
    }
    std::printf("]\n");
    return 0;
  }
  if (a.format == "csv") {
    std::printf("seqlen,pass,algorithm,source,read_bytes,write_bytes\n");
    for (const Row& r : rows) {
      const struct {
        const char* pass;
        const char* alg;
        const Traffic* t;
      } items[] = {{"forward", "standard", &r.sf}, {"forward", "flash", &r.ff}, {"forward", "compulsory", &r.cf},
                   {"backward", "standard", &r.sb}, {"backward", "flash", &r.fb}, {"backward", "compulsory", &r.cb}};
      for (const auto& it : items)
        std::printf("%lld,%s,%s,model,%.0f,%.0f\n", (long long)r.n, it.pass, it.alg, it.t->read, it.t->write);
    }
    return 0;
  }
  std::printf("Bytes moved through main memory by one call (analytic model, docs/traffic-model.md)\n");
  std::printf("%s, batch %lld, %lld heads, head_dim %lld, %s, %s; S and P stored in the working dtype\n\n", to_string(parse_dtype(a.dtype, device)),
              (long long)a.batch, (long long)a.heads, (long long)a.head_dim, a.causal ? "causal" : "no mask",
              device == Device::cpu ? "cpu" : "cuda");
  std::printf("%7s | %-28s %-28s %9s | %-28s %-28s %9s\n", "", "forward standard (read/write)", "forward flash",
              "std/flash", "backward standard", "backward flash", "std/flash");
  for (const Row& r : rows) {
    auto rw = [](const Traffic& t) { return human_bytes(t.read) + " / " + human_bytes(t.write); };
    std::printf("%7lld | %-28s %-28s %8.0fx | %-28s %-28s %8.0fx\n", (long long)r.n, rw(r.sf).c_str(), rw(r.ff).c_str(),
                r.sf.total() / r.ff.total(), rw(r.sb).c_str(), rw(r.fb).c_str(), r.sb.total() / r.fb.total());
  }
  std::printf("\nflash moves the compulsory bytes (Q, K, V read once; O, LSE written once) and nothing that grows as N².\n");
  return 0;
}

}  // namespace flashattn::tools
