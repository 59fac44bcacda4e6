// kvcheck_gpu_probe: is a CUDA device usable here? Exit 0 and the device's description, or exit 3 and the CUDA
// error in words. tools/gpu/run.sh asks it first and prints that error for every GPU step it then skips.
#include "common.hpp"
#include "device_info.hpp"

#include <cstdio>

int main() {
    const std::string why = kvc::gpubench::no_device_reason();
    if (!why.empty()) {
        std::printf("%s\n", why.c_str());
        return 3;
    }
    try {
        nlohmann::json info;
        std::fputs(kvc::gpubench::describe_device(info).c_str(), stdout);
        return 0;
    } catch (const std::exception& e) {
        std::printf("no usable CUDA device: %s\n", e.what());
        return 3;
    }
}
