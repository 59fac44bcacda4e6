// A number as a document prints it, and the promise its digits make: "0.47" is correct to within 0.005.
#pragma once

#include <stdexcept>
#include <string>

namespace kvc::golden {

// A golden file that cannot be read as the schema says. `path` is a JSON pointer into the file ("" for the root).
class FormatError : public std::runtime_error {
public:
    FormatError(std::string path, const std::string& what) : std::runtime_error(what), path_(std::move(path)) {}
    const std::string& path() const { return path_; }

private:
    std::string path_;
};

// "/entries/3: missing field \"printed\"", or just the message when the error is about the whole file.
inline std::string describe(const FormatError& e) { return e.path().empty() ? e.what() : e.path() + ": " + e.what(); }

struct Printed {
    long double value = 0; // "1,471" -> 1471, "~0.27" -> 0.27
    int decimals = 0;      // digits after the point: "0.47" -> 2, "5,049" -> 0
};

// Accepts an optional "~" or "≈", an optional "-", digits with optional thousands commas, an optional ".digits".
// Anything else throws FormatError (path "").
Printed parse_printed(const std::string& text);

// How far the reference may be from a printed number: 0 when the document is exact, else half a unit in the last
// printed digit (0.47 -> 0.005, 50 -> 0.5).
long double printed_tolerance(int decimals, bool exact);

} // namespace kvc::golden
