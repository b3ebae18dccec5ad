# Installing lockstep as HPC software (included at the end of the top-level CMakeLists.txt).
#   cmake --install build --prefix P   programs in P/bin; headers, libraries and the CMake package
#                                      (find_package(lockstep)) for programs of one's own; configs,
#                                      Slurm templates and the Lmod modulefile in P/share/lockstep;
#                                      docs in P/share/doc/lockstep.
#   cd build && cpack -G DEB           the same tree as two Debian packages under /usr: lockstep
#                                      (runtime) and lockstep-dev (headers, libraries, package).
# The tree is relocatable: programs find the libraries by an RPATH relative to themselves
# ($ORIGIN/../lib), the package's files locate themselves (CMAKE_CURRENT_LIST_DIR), the modulefile
# derives the prefix from its own path. No file holds a build-tree or source-tree path.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(LOCKSTEP_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/lockstep)
set(LOCKSTEP_INSTALL_SHAREDIR ${CMAKE_INSTALL_DATADIR}/lockstep)

# `lockstep-train --version` (src/ops/build_info.cpp) prints the project's version.
set_property(SOURCE ${PROJECT_SOURCE_DIR}/src/ops/build_info.cpp APPEND PROPERTY
             COMPILE_DEFINITIONS LOCKSTEP_VERSION_STRING="${PROJECT_VERSION}")

# ---- programs and libraries
set(LOCKSTEP_INSTALLED_APPS "")
foreach(app lockstep-train lockstep-shard lockstep-bench lockstep-generate lockstep-trace)
  if(TARGET ${app})
    list(APPEND LOCKSTEP_INSTALLED_APPS ${app})
  endif()
endforeach()
file(RELATIVE_PATH LOCKSTEP_BIN_TO_LIB ${CMAKE_INSTALL_FULL_BINDIR} ${CMAKE_INSTALL_FULL_LIBDIR})
# Only the shared build needs these; a static build links the layers into each program.
set_target_properties(${LOCKSTEP_INSTALLED_APPS} PROPERTIES
                      INSTALL_RPATH "$ORIGIN/${LOCKSTEP_BIN_TO_LIB}")
install(TARGETS ${LOCKSTEP_INSTALLED_APPS} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        COMPONENT Runtime)

set(LOCKSTEP_LAYER_TARGETS "")
foreach(layer ${LOCKSTEP_BUILT_LAYERS})
  # lockstep::core, lockstep::ops, ... for programs that need only some layers.
  set_target_properties(lockstep_${layer} PROPERTIES EXPORT_NAME ${layer} INSTALL_RPATH "$ORIGIN")
  list(APPEND LOCKSTEP_LAYER_TARGETS lockstep_${layer})
  install(DIRECTORY include/lockstep/${layer} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/lockstep
          COMPONENT Development)
endforeach()
install(TARGETS lockstep ${LOCKSTEP_LAYER_TARGETS} EXPORT lockstepTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT Development
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT Runtime
                NAMELINK_COMPONENT Development
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT Runtime)

# ---- the CMake package: find_package(lockstep CONFIG) -> lockstep::lockstep and one target per
# layer, each carrying its include path and its dependencies (found again by lockstepConfig.cmake).
install(EXPORT lockstepTargets NAMESPACE lockstep:: DESTINATION ${LOCKSTEP_INSTALL_CMAKEDIR}
        COMPONENT Development)
configure_package_config_file(cmake/lockstepConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/lockstepConfig.cmake
                              INSTALL_DESTINATION ${LOCKSTEP_INSTALL_CMAKEDIR})
# 0.x: a new minor version may change the API, so only the same minor version is compatible.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/lockstepConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/lockstepConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/lockstepConfigVersion.cmake
        DESTINATION ${LOCKSTEP_INSTALL_CMAKEDIR} COMPONENT Development)

# ---- shared files: configs, Slurm templates, the example, docs
install(DIRECTORY configs/ DESTINATION ${LOCKSTEP_INSTALL_SHAREDIR}/configs COMPONENT Runtime
        FILES_MATCHING PATTERN "*.ini")
install(DIRECTORY slurm/ DESTINATION ${LOCKSTEP_INSTALL_SHAREDIR}/slurm USE_SOURCE_PERMISSIONS
        COMPONENT Runtime)
install(DIRECTORY examples/ DESTINATION ${LOCKSTEP_INSTALL_SHAREDIR}/examples
        COMPONENT Development)
install(FILES README.md DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT Runtime)
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT Runtime)

# ---- the Lmod modulefile: P/share/lockstep/modulefiles/lockstep/<version>.lua. It finds P from
# its own path (so many levels up), so it needs no prefix baked in and a moved tree still works.
set(LOCKSTEP_MODULE_DIR ${LOCKSTEP_INSTALL_SHAREDIR}/modulefiles/lockstep)
string(REGEX MATCHALL "[^/]+" _parts "${LOCKSTEP_MODULE_DIR}")
list(LENGTH _parts LOCKSTEP_MODULE_DEPTH)
math(EXPR LOCKSTEP_MODULE_DEPTH "${LOCKSTEP_MODULE_DEPTH} + 1")  # the file name itself
set(LOCKSTEP_MODULE_LIBDIR ${CMAKE_INSTALL_LIBDIR})
if(BUILD_SHARED_LIBS)
  set(LOCKSTEP_MODULE_SHARED "true")
else()
  set(LOCKSTEP_MODULE_SHARED "false")
endif()
if(LOCKSTEP_HAVE_CUDA)
  set(LOCKSTEP_MODULE_CUDA "built with CUDA ${CUDAToolkit_VERSION}: load the site's CUDA module too")
else()
  set(LOCKSTEP_MODULE_CUDA "CPU-only build")
endif()
configure_file(cmake/lockstep.lua.in ${CMAKE_CURRENT_BINARY_DIR}/modulefile/${PROJECT_VERSION}.lua
               @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/modulefile/${PROJECT_VERSION}.lua
        DESTINATION ${LOCKSTEP_MODULE_DIR} COMPONENT Runtime)

# ---- the Debian packages (cpack -G DEB in the build folder), the tree under /usr, split the Debian
# way: lockstep (programs, configs, Slurm templates, modulefile, docs; what a cluster user needs)
# and lockstep-dev (headers, libraries, the CMake package, the example; for programs of one's
# own). Only lockstep-dev puts files in /usr/include and /usr/lib.
# lockstep's Depends lists Debian 12's package of every library the programs load (their NEEDED
# entries, checked with readelf -d and dpkg -S) and openmpi-bin for mpirun. A CUDA build also
# needs NVIDIA's CUDA runtime (linked) and, on GPU runs, cuBLAS, cuDNN and NCCL (dlopen'ed), which are not Debian packages: they are not
# in Depends, and the description says so; -DLOCKSTEP_CUDA=OFF builds a CPU-only package.
set(CPACK_PACKAGE_NAME lockstep)
set(CPACK_PACKAGE_VENDOR "lockstep")
set(CPACK_PACKAGE_CONTACT "lockstep maintainers <lockstep@localhost>")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL Runtime Development)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME lockstep)
set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_NAME lockstep-dev)
set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_DEPENDS
    "libc6 (>= 2.36), libstdc++6 (>= 12), libgcc-s1, libgomp1, libopenmpi3 (>= 4.1), openmpi-bin, libhdf5-103-1, libboost-program-options1.74.0, libopenblas0, libdnnl2, libicu72, zlib1g, libzstd1, libjpeg62-turbo, libpng16-16")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SUGGESTS "lmod, slurm-client")
# What find_package(lockstep) finds again (cmake/lockstepConfig.cmake.in).
set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_DEPENDS
    "lockstep (= ${PROJECT_VERSION}), cmake (>= 3.25), g++, libopenmpi-dev, libhdf5-dev, libboost-program-options-dev, libopenblas-dev, libdnnl-dev, libicu-dev, zlib1g-dev, libzstd-dev, libjpeg62-turbo-dev, libpng-dev")
if(LOCKSTEP_HAVE_CUDA)
  set(LOCKSTEP_DEB_BUILD "Built with CUDA ${CUDAToolkit_VERSION}: it links NVIDIA's CUDA runtime and opens cuBLAS, cuDNN 9 and NCCL when a run asks for a GPU (not Debian packages, so not in Depends): they must be on the library path of GPU nodes only.")
else()
  set(LOCKSTEP_DEB_BUILD "CPU-only build (no CUDA).")
endif()
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION
    "data-parallel neural-network training for HPC clusters\nlockstep-train, lockstep-shard, lockstep-bench; configs, Slurm templates and an Lmod modulefile in /usr/share/lockstep. ${LOCKSTEP_DEB_BUILD}")
set(CPACK_COMPONENT_DEVELOPMENT_DESCRIPTION
    "lockstep's headers, libraries and CMake package\nfind_package(lockstep CONFIG) gives lockstep::lockstep and one target per layer; an example is in /usr/share/lockstep/examples. ${LOCKSTEP_DEB_BUILD}")
include(CPack)
