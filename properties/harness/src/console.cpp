#include "kvcheck/harness/console.hpp"

#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <sstream>

namespace kvc::harness {

Progress::Progress(std::size_t total) : total_(total), tty_(isatty(STDERR_FILENO) == 1) {}

void Progress::step(const std::string& label, const std::string& case_id) {
    ++done_;
    if (!tty_) return;
    const auto now = std::chrono::steady_clock::now();
    if (done_ != total_ && now - last_ < std::chrono::milliseconds(50)) return;
    last_ = now;
    constexpr std::size_t width = 30;
    const std::size_t filled = total_ ? done_ * width / total_ : width;
    std::cerr << "\r\033[K[" << std::string(filled, '#') << std::string(width - filled, '.') << "] " << done_ << "/"
              << total_ << " " << label << " " << case_id << std::flush;
    shown_ = true;
}

void Progress::property_done(const std::string& label, const std::string& property, const Row& row) {
    if (tty_) return;
    std::cerr << "kvcheck: [" << label << "] " << property << " done:";
    for (int i = 0; i < kVerdictCount; ++i)
        if (row.counts[i]) std::cerr << " " << row.counts[i] << " " << prop::verdict_name(kVerdicts[i]);
    if (row.outside) std::cerr << " " << row.outside << " outside the declaration";
    std::cerr << " (" << done_ << "/" << total_ << ")\n";
}

void Progress::clear() {
    if (tty_ && shown_) std::cerr << "\r\033[K" << std::flush;
    shown_ = false;
}

std::string indent(const std::string& text, const std::string& pad) {
    std::string out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) out += pad + line + "\n";
    return out;
}

std::string case_details(const prop::CaseResult& r, const std::string& label, const std::string& case_text,
                         const std::string& output, const std::string& replay_command, uint64_t run_seed, bool full) {
    using prop::Verdict;
    std::ostringstream s;
    s << prop::verdict_name(r.verdict) << " " << r.id << " (" << label << ")";
    if (!full) {
        s << ": " << r.reason;
        if (!replay_command.empty()) s << "\n  replay: " << replay_command;
        s << "\n";
        return s.str();
    }
    s << "\n  property: " << r.property;
    if (!r.failed_property.empty() && r.failed_property != r.property) s << " (violated: " << r.failed_property << ")";
    s << "\n  reason: " << r.reason << "\n";
    if (r.mismatch) s << "  first mismatch: " << prop::mismatch_text(*r.mismatch) << "\n";
    const bool unshrunk = std::any_of(r.notes.begin(), r.notes.end(),
                                      [](const std::string& n) { return n.rfind("not shrunk", 0) == 0; });
    if (r.verdict == Verdict::Fail && unshrunk)
        s << "  counterexample (not shrunk; case seed " << r.seed << ", run seed " << run_seed << "):\n";
    else if (r.verdict == Verdict::Fail)
        s << "  counterexample (shrunk in " << r.shrink_steps << " steps; case seed " << r.seed << ", run seed "
          << run_seed << "):\n";
    else
        s << "  case (case seed " << r.seed << ", run seed " << run_seed << "):\n";
    s << indent(case_text, "    ");
    for (const std::string& n : r.notes) s << "  note: " << n << "\n";
    if (!output.empty()) s << "  the implementation wrote:\n" << indent(output, "    | ");
    if (!replay_command.empty()) s << "  replay: " << replay_command << "\n";
    return s.str();
}

} // namespace kvc::harness
