// The text `kvcheck golden verify` prints: one line per file, each problem on its own line with the file, the JSON
// pointer, what the file says and what the reference gives, then one total line.
#include "kvcheck/golden/golden.hpp"

namespace kvc::golden {
namespace {

std::string plural(size_t n, const char* one, const char* many) {
    return std::to_string(n) + " " + (n == 1 ? one : many);
}

} // namespace

std::string format_report(const Report& report) {
    const std::string regen = std::string("run ") + kRegenCommand;
    if (!report.internal.empty()) return "golden: internal error: " + report.internal + "\n";
    if (!report.error.empty()) return "golden: " + report.error + "\n";
    std::string out;
    size_t numbers = 0, mismatches = 0, stale = 0, malformed = 0;
    for (const FileReport& f : report.files) {
        if (!f.malformed.empty()) {
            ++malformed;
            out += "golden: " + f.file + ": MALFORMED: " + f.malformed + "\n";
            out += "  repair it (or restore it with git); if only computed fields are missing, " + regen + "\n";
            continue;
        }
        numbers += static_cast<size_t>(f.numbers());
        mismatches += f.mismatches.size();
        stale += f.stale.size();
        out += "golden: " + f.file + ": " + std::to_string(f.numbers()) + " numbers (" + std::to_string(f.printed) +
               " printed, " + std::to_string(f.derived) + " derived or assumed), " +
               plural(f.mismatches.size(), "mismatch", "mismatches") +
               (f.stale.empty() ? "" : ", " + std::to_string(f.stale.size()) + " stale") + "\n";
        for (const Problem& p : f.mismatches)
            out += "  MISMATCH " + f.file + " " + p.path + " (" + p.entry + "): document " + p.expected +
                   ", reference " + p.actual + "\n";
        for (const Problem& p : f.stale)
            out += "  STALE " + f.file + " " + p.path + " (" + p.entry + "): file " + p.expected + ", reference " +
                   p.actual + "\n";
        if (!f.stale.empty()) out += "  " + f.file + " is stale: " + regen + "\n";
    }
    for (const std::string& q : report.unchecked)
        out += "golden: no file checks the reference's " + q + " (a golden file or entry is missing)\n";
    out += "golden: " + std::to_string(numbers) + " numbers checked in " + plural(report.files.size(), "file", "files") +
           ", " + plural(mismatches, "mismatch", "mismatches");
    if (stale) out += ", " + std::to_string(stale) + " stale (" + regen + ")";
    if (malformed) out += ", " + plural(malformed, "malformed file", "malformed files");
    return out + "\n";
}

} // namespace kvc::golden
