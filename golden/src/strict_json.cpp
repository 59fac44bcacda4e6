#include "strict_json.hpp"

#include "kvcheck/golden/printed.hpp" // FormatError

#include <set>
#include <vector>

namespace kvc::golden {
namespace {

using nlohmann::json;

// Where the parser is: one frame per open object or array, so the error can name a JSON pointer.
struct Frame {
    bool object = false;
    std::set<std::string> keys; // objects: keys seen so far
    std::string key;            // objects: the member being read
    size_t index = 0;           // arrays: the element being read
};

std::string escape_token(const std::string& key) { // RFC 6901: "~" -> "~0", "/" -> "~1"
    std::string out;
    for (char c : key) {
        if (c == '~') out += "~0";
        else if (c == '/') out += "~1";
        else out += c;
    }
    return out;
}

std::string pointer(const std::vector<Frame>& stack) {
    std::string p;
    for (const Frame& f : stack) p += "/" + (f.object ? escape_token(f.key) : std::to_string(f.index));
    return p;
}

} // namespace

json parse_strict(const std::string& text) {
    std::vector<Frame> stack;
    auto element_done = [&stack] {
        if (!stack.empty() && !stack.back().object) ++stack.back().index;
    };
    const json::parser_callback_t check = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
        switch (event) {
        case json::parse_event_t::object_start:
        case json::parse_event_t::array_start:
            stack.push_back(Frame{event == json::parse_event_t::object_start, {}, {}, 0});
            break;
        case json::parse_event_t::key: {
            Frame& top = stack.back();
            top.key = parsed.get<std::string>();
            if (!top.keys.insert(top.key).second)
                throw FormatError(pointer(stack), "duplicate key \"" + top.key + "\" (JSON keeps only one of them)");
            break;
        }
        case json::parse_event_t::object_end:
        case json::parse_event_t::array_end:
            stack.pop_back();
            element_done();
            break;
        case json::parse_event_t::value:
            element_done();
            break;
        }
        return true;
    };
    return json::parse(text, check);
}

} // namespace kvc::golden
