#include "kvcheck/harness/builtins.hpp"

namespace kvc {

namespace {

const std::vector<Builtin>* registered = nullptr;

} // namespace

void register_builtins(const std::vector<Builtin>& list) { registered = &list; }

const std::vector<Builtin>& builtins() {
    static const std::vector<Builtin> none;
    return registered ? *registered : none;
}

std::string unavailable_reason(const Builtin& b) {
    if (b.unavailable == nullptr) return "";
    const char* why = b.unavailable();
    return why ? why : "";
}

const Builtin* find_builtin(const std::string& name) {
    for (const Builtin& b : builtins())
        if (b.name == name) return &b;
    return nullptr;
}

} // namespace kvc
