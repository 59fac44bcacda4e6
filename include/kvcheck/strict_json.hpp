// The one JSON reader every file kvcheck accepts goes through (replay files, vectors and results manifests,
// safetensors headers, capability files, golden files): strict and linear.
//
// Strict: a key that appears twice in one object is an error (JSON readers disagree on which one counts, so a file
// could say one thing to kvcheck and another to the tool that wrote it), and so are nesting deeper than
// max_depth and more than max_values values in one document.
// Linear: it is a SAX handler that builds the document as the parser reads it. nlohmann/json's callback parser
// (json::parse(text, callback)) looks back over the enclosing array at the end of every object, so an array of n
// objects costs O(n^2): seconds at a few hundred KB, days at our 64 MiB file limit. Here each event is O(1) except
// a key, which costs a lookup in its own object (O(log k)). Memory is bounded by max_values.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvc::json_strict {

struct Limits {
    std::size_t max_depth = 128;        // open objects and arrays at once
    std::size_t max_values = 4u << 20;  // values of every kind, containers included (about 4 million)
};

// A document that parses but breaks a rule of this reader. `pointer` is the JSON pointer (RFC 6901) where it
// happened, e.g. "/entries/45/printed".
class Violation : public std::runtime_error {
public:
    enum class Kind { DuplicateKey, TooDeep, TooManyValues };
    Violation(Kind kind, std::string pointer, const std::string& what, std::string key = {})
        : std::runtime_error(what), kind_(kind), pointer_(std::move(pointer)), key_(std::move(key)) {}
    Kind kind() const { return kind_; }
    const std::string& pointer() const { return pointer_; }
    const std::string& key() const { return key_; } // DuplicateKey: the key

private:
    Kind kind_;
    std::string pointer_, key_;
};

namespace detail {

// Builds the DOM the way nlohmann's own json_sax_dom_parser does, plus the checks and the path for messages.
class Builder {
public:
    using json = nlohmann::json;
    explicit Builder(json& root, const Limits& limits) : root_(root), limits_(limits) {}

    bool null() { return put(nullptr); }
    bool boolean(bool v) { return put(v); }
    bool number_integer(json::number_integer_t v) { return put(v); }
    bool number_unsigned(json::number_unsigned_t v) { return put(v); }
    bool number_float(json::number_float_t v, const json::string_t&) { return put(v); }
    bool string(json::string_t& v) { return put(std::move(v)); }
    bool binary(json::binary_t& v) { return put(json::binary(std::move(v))); }

    bool start_object(std::size_t) { return open(json::value_t::object); }
    bool start_array(std::size_t) { return open(json::value_t::array); }
    bool end_object() { return close(); }
    bool end_array() { return close(); }

    bool key(json::string_t& k) {
        Frame& f = frames_.back();
        if (f.value->contains(k))
            throw Violation(Violation::Kind::DuplicateKey, pointer_with(k),
                            "the key " + quoted(k) + " appears twice in one object (JSON readers disagree on which "
                            "one counts)",
                            k);
        f.key = k;
        f.slot = &(*f.value)[k];
        return true;
    }

    // Syntax errors and numbers out of range (1e400): the parser's own exception, thrown as its own type.
    template <class Exception>
    bool parse_error(std::size_t, const std::string&, const Exception& e) {
        throw e;
    }

private:
    struct Frame {
        json* value = nullptr;  // the object or array being filled
        std::string key;        // objects: the member being read
        json* slot = nullptr;   // objects: where that member's value goes
    };

    json* place(json&& v) {
        count();
        if (frames_.empty()) {
            root_ = std::move(v);
            return &root_;
        }
        Frame& f = frames_.back();
        if (f.value->is_array()) {
            f.value->push_back(std::move(v));
            return &f.value->back();
        }
        *f.slot = std::move(v);
        return f.slot;
    }
    bool put(json&& v) {
        place(std::move(v));
        return true;
    }
    bool open(json::value_t t) {
        if (frames_.size() >= limits_.max_depth)
            throw Violation(Violation::Kind::TooDeep, pointer(),
                            "nested deeper than " + std::to_string(limits_.max_depth) + " levels");
        json* v = place(json(t));
        frames_.push_back(Frame{v, {}, nullptr});
        return true;
    }
    bool close() {
        frames_.pop_back();
        return true;
    }
    void count() {
        if (++values_ > limits_.max_values)
            throw Violation(Violation::Kind::TooManyValues, pointer(),
                            "more than " + std::to_string(limits_.max_values) + " values in one document");
    }

    static std::string quoted(const std::string& k) {
        const std::string shown = k.size() > 64 ? k.substr(0, 64) + "..." : k;
        return json(shown).dump(-1, ' ', false, json::error_handler_t::replace);
    }
    static std::string token(const std::string& k) { // RFC 6901: "~" -> "~0", "/" -> "~1"
        std::string out;
        for (char c : k) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
        return out;
    }
    // The path to the value being read. An enclosing array's current element is its last one; the innermost
    // array's is the one about to be added.
    std::string pointer() const { return path(frames_.size()); }
    std::string pointer_with(const std::string& k) const { return path(frames_.size() - 1) + "/" + token(k); }
    std::string path(std::size_t n_frames) const {
        std::string p;
        for (std::size_t i = 0; i < n_frames; ++i) {
            const json& v = *frames_[i].value;
            const bool enclosing = i + 1 < frames_.size();
            p += "/" + (v.is_array() ? std::to_string(enclosing ? v.size() - 1 : v.size()) : token(frames_[i].key));
        }
        return p;
    }

    json& root_;
    Limits limits_;
    std::vector<Frame> frames_;
    std::size_t values_ = 0;
};

} // namespace detail

// Parses `text` (one JSON document, nothing but whitespace after it). Throws nlohmann::json::parse_error on bad
// syntax, nlohmann::json::out_of_range on a number no double holds, and Violation on a duplicate key, nesting
// deeper than limits.max_depth or more than limits.max_values values.
inline nlohmann::json parse(const std::string& text, const Limits& limits = {}) {
    nlohmann::json root;
    detail::Builder b(root, limits);
    nlohmann::json::sax_parse(text, &b);
    return root;
}

} // namespace kvc::json_strict
