// What a run shows a person: progress on stderr, and a case that did not pass on stdout.
#pragma once

#include "kvcheck/harness/verdicts.hpp"
#include "kvcheck/properties/runner.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace kvc::harness {

// Progress on stderr: a bar redrawn in place on a terminal, one line per finished property otherwise.
class Progress {
public:
    explicit Progress(std::size_t total);
    void step(const std::string& label, const std::string& case_id);
    // A property of one implementation is done: a plain line for logs.
    void property_done(const std::string& label, const std::string& property, const Row& row);
    // Clears the bar before something else is printed on the terminal.
    void clear();

private:
    std::size_t total_, done_ = 0;
    bool tty_, shown_ = false;
    std::chrono::steady_clock::time_point last_{};
};

// Every line of text prefixed with pad.
std::string indent(const std::string& text, const std::string& pad);

// A case that did not pass: in full (property, reason, first mismatch, the case, notes, what the implementation
// wrote, the replay command) or, when !full, on one line with its replay command.
std::string case_details(const prop::CaseResult& r, const std::string& label, const std::string& case_text,
                         const std::string& output, const std::string& replay_command, uint64_t run_seed, bool full);

} // namespace kvc::harness
